"""A scaling model toward 512 workers, fitted to what hora measures on this machine.

This machine has one host and two cores: 512 workers cannot be run here, so they are predicted. The model:

1. **Fit alpha and beta** (per-message and per-byte cost) of hora's allreduce paths from runs on this machine:
   the shared-memory path and the TCP ring at N = 2 and 4 (``benchmarks/collectives.py --json``, run by this script
   unless ``--from-json`` gives a result file). For a ring of N ranks, t(bytes) = 2(N-1)·alpha + 2(N-1)/N·bytes·beta, so
   a least-squares line t = a + b·bytes gives alpha = a / 2(N-1) and beta = b·N / 2(N-1).
2. **Compose the hierarchical allreduce** of H hosts x L ranks per host, as hora runs it: a shared-memory
   reduce-scatter and allgather within each host (the fitted shm path at L ranks), and L TCP rings across the
   hosts, each carrying 1/L of the bytes, all through one NIC per host: a host sends 2(H-1)/H·bytes in total, at
   the link's rate or the fitted TCP per-byte cost, whichever is slower, plus 2(H-1) message latencies.
3. **Step time and efficiency** for each model's gradients (float32), fused into ``--fusion-mb`` buffers:
   T_step = T_compute + max(0, T_allreduce - overlap·T_backward), efficiency = T_compute / T_step. Backward is 2/3
   of compute; ``--overlap`` (default 0.7) is the share of backward that allreduce can hide behind (Horovod starts
   allreducing gradients as backward produces them).

Assumptions (all are flags, but the first): the per-byte and per-message costs are the N = 2 fits (each rank has
a core of its own, as on a real host; the N = 4 fits are printed, but 4 ranks on 2 cores measure oversubscription);
per-GPU compute times per step are the P100 numbers of the Horovod paper's set-up
(batch 64 per GPU; ``COMPUTE_S``), 4 workers per host as in the paper, the network's message latency ``--net-alpha-us``
(default 25 µs: a TCP round trip on a data-centre network; loopback here is faster than any real link, so the larger
of the two is used). The Horovod paper (Sergeev & Del Balso, 2018, 128 hosts x 4 P100, 25 Gbit/s RoCE) reports about
90 % efficiency for Inception V3 and ResNet-101 at 512 GPUs and 68 % for VGG-16; they are printed beside the model.

    python benchmarks/scaling_model.py                           # measure here (about 2 minutes), then predict
    python benchmarks/scaling_model.py --from-json /tmp/coll.json # reuse a collectives.py --json result
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

#: float32 gradient bytes per step.
GRADIENT_BYTES = {"ResNet-50": 25.6e6 * 4, "Inception V3": 23.8e6 * 4, "VGG-16": 138.4e6 * 4}
#: Seconds of compute per step on one P100 at batch 64 (images/s from the TensorFlow benchmarks of that time:
#: ResNet-50 ~220, Inception V3 ~140, VGG-16 ~130).
COMPUTE_S = {"ResNet-50": 64 / 220, "Inception V3": 64 / 140, "VGG-16": 64 / 130}
#: The Horovod paper's measured efficiency at 512 GPUs (ResNet-101 stands in for ResNet-50: not in the paper).
PAPER_512 = {"ResNet-50": "~90 % (ResNet-101)", "Inception V3": "~90 %", "VGG-16": "68 %"}
WORKERS = (8, 16, 32, 64, 128, 256, 512)


def measure(path: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "collectives.py"), "--frameworks", "hora,hora-tcp", "--ops",
           "allreduce", "--np", "2,4", "--sizes", "64K,1M,4M,16M,64M", "--json", path]  # fmt: skip
    print("measuring: " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def fit(results: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[float, float]]:
    """(framework, N) -> (alpha seconds per message, beta seconds per byte) of a ring allreduce, from quiet results."""
    out = {}
    for key in sorted({(r["framework"], r["np"]) for r in results if r["op"] == "allreduce"}):
        rows = [r for r in results if (r["framework"], r["np"]) == key and r["op"] == "allreduce"
                and r.get("load", 0) == 0 and r["ok"]]  # fmt: skip
        if len(rows) < 2:
            continue
        x = np.array([r["size"] for r in rows], float)
        t = np.array([r["time_median_s"] for r in rows], float)
        b, a = np.polyfit(x, t, 1, w=1 / t)  # relative errors: small messages count as much as large ones
        n = key[1]
        out[key] = (max(a, 1e-7) / (2 * (n - 1)), max(b, 1e-13) * n / (2 * (n - 1)))
    return out


def ring(n: int, nbytes: float, alpha: float, beta: float) -> float:
    return 0.0 if n <= 1 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


def allreduce_time(hosts: int, local: int, nbytes: float, params: dict[str, Any]) -> float:
    shm_alpha, shm_beta = params["shm"]
    tcp_alpha, tcp_beta = params["tcp"]
    within = ring(local, nbytes, shm_alpha, shm_beta)
    link_beta = 8 / (params["gbit"] * 1e9)
    across = 0.0
    if hosts > 1:
        alpha = max(tcp_alpha, params["net_alpha"])
        across = 2 * (hosts - 1) * alpha + 2 * (hosts - 1) / hosts * nbytes * max(link_beta, tcp_beta / local)
    return within + across


def predict(model: str, workers: int, params: dict[str, Any]) -> tuple[float, float]:
    local = params["local"]
    hosts = max(1, workers // local)
    grads, fusion = GRADIENT_BYTES[model], params["fusion"]
    buffers = [fusion] * int(grads // fusion) + ([grads % fusion] if grads % fusion else [])
    comm = sum(allreduce_time(hosts, min(local, workers), b, params) for b in buffers)
    compute = COMPUTE_S[model]
    step = compute + max(0.0, comm - params["overlap"] * compute * 2 / 3)
    return comm, compute / step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from-json", metavar="PATH", help="a benchmarks/collectives.py --json result to fit")
    p.add_argument("--local", type=int, default=4, help="workers per host (4, as in the Horovod paper)")
    p.add_argument("--net-alpha-us", type=float, default=25.0, help="network message latency, µs (25)")
    p.add_argument("--fusion-mb", type=float, default=64.0, help="fusion buffer, MiB (hora's default 64)")
    p.add_argument("--overlap", type=float, default=0.7, help="share of backward that hides allreduce (0.7)")
    args = p.parse_args(argv)
    path = args.from_json
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="hora-scaling-"), "collectives.json")
        measure(path)
    with open(path) as f:
        fitted = fit(json.load(f)["results"])
    # The fit at N = 2 gives each rank a core of its own, as on a real host (one core or more per GPU worker); the
    # N = 4 runs share 2 cores between 4 ranks here, so their per-byte cost measures oversubscription, not the path.
    n = 2 if ("hora", 2) in fitted else 4
    print("# Scaling model\n")
    print("Fitted on this machine (ring form: t = 2(N-1)·alpha + 2(N-1)/N·bytes·beta):\n")
    print("| path | N | alpha per message | beta per byte | bandwidth 1/beta |\n|---|---:|---:|---:|---:|")
    for (fw, k), (alpha, beta) in sorted(fitted.items()):
        label = "shared memory" if fw == "hora" else "TCP ring (loopback)"
        print(f"| {label} | {k} | {alpha * 1e6:.1f} µs | {beta * 1e12:.0f} ps | {1 / beta / 1e9:.2f} GB/s |")
    print()
    for gbit in (25, 100):
        params = {
            "shm": fitted[("hora", n)], "tcp": fitted.get(("hora-tcp", n), fitted[("hora", n)]), "gbit": gbit,
            "net_alpha": args.net_alpha_us * 1e-6, "local": args.local, "fusion": args.fusion_mb * (1 << 20),
            "overlap": args.overlap,
        }  # fmt: skip
        print(f"## {gbit} Gbit/s links, {args.local} workers per host (hierarchical allreduce)\n")
        header = ["workers", *[f"{m}: allreduce / efficiency" for m in GRADIENT_BYTES]]
        print("| " + " | ".join(header) + " |\n|" + "|".join(["---:"] * len(header)) + "|")
        for w in WORKERS:
            cells = []
            for m in GRADIENT_BYTES:
                comm, eff = predict(m, w, params)
                cells.append(f"{comm * 1e3:.0f} ms / {eff:.0%}")
            print(f"| {w} | " + " | ".join(cells) + " |")
        print("| Horovod paper, 512 | " + " | ".join(PAPER_512[m] for m in GRADIENT_BYTES) + " |\n")
    if not math.isfinite(sum(a + b for a, b in fitted.values())):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
