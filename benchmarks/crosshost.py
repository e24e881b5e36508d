"""Cross-host allreduce: hora (hierarchical and flat) vs torch.distributed gloo vs raw TCP, on two namespace hosts.

Driver (default; needs root, ``ip netns``, sshd and ssh, as the multi-host tests do): builds two "hosts" with
tests/support/netns_hosts.py (Linux network namespaces on one bridge, each with its own sshd and a throwaway key), then, for each
layout (2 hosts x 1 rank, 2 hosts x 2 ranks), measures in one run and in this order:

- raw TCP on the same link: a Python sender/receiver pair, one process in each namespace, moving large buffers with
  ``sendall``/``recv_into`` over as many TCP streams per direction as there are ranks per host, first one way, then
  both ways at once (what an allreduce needs: every host sends and receives at the same time);
- hora hierarchical (the multi-host default) and hora flat (``--no-hierarchical-allreduce``), both started with
  ``hora run -np 2k -H a:k,b:k`` over SSH from the root namespace;
- torch.distributed gloo, started the same way (``hora run`` exports RANK, WORLD_SIZE, MASTER_ADDR = host a's
  namespace address, MASTER_PORT; ``GLOO_SOCKET_IFNAME`` names the namespace NIC).

Then it prints one Markdown table per layout::

    python benchmarks/crosshost.py                           # sizes 1M,16M,64M,256M; layouts 1,2 ranks per host
    python benchmarks/crosshost.py --rate 1gbit              # the same on a link limited by tc tbf to 1 Gbit/s
    python benchmarks/crosshost.py --sizes 1M,4M --iters 3   # a quick check that everything runs

``--rate`` puts ``tc qdisc add dev <nic> root tbf rate R burst B latency L`` on every host's end of its veth pair
(so each direction of the link is limited where it leaves the host); tc netem is not needed.

The hora and gloo ranks run benchmarks/collectives.py's backends and timing (``measure``): a correctness check on
a known pattern, ``--warmup`` untimed iterations, every timed iteration after a barrier, the slowest rank's time per
iteration, the median over iterations; busbw = algbw * 2(N-1)/N (nccl-tests; N = ranks; GB/s = 1e9 B/s).

Against the link: an allreduce over H hosts must move at least size * 2(H-1)/H bytes out of (and into) every host,
so the best busbw the link allows is ``raw * (2(N-1)/N) / (2(H-1)/H)``, where raw is the TCP throughput per
direction with both directions busy. The table shows that bound as the "raw TCP" column, and hora/raw = hora's
busbw / that bound (the share of the link's TCP throughput the allreduce achieves). Everything the driver starts
(namespaces, sshd, ranks, qdiscs) is torn down when it ends, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    emit,
    finish,
    format_gbps,
    format_size,
    hora_command,
    machine,
    parse_counts,
    parse_size,
    run_ranks,
    torch_missing,
)

HERE = Path(__file__).resolve()
TESTS = HERE.parent.parent / "tests"  # tests/support/netns_hosts.py builds the namespace hosts
DEFAULT_SIZES = "1M,16M,64M,256M"
SYSTEMS = ("hora-hier", "hora-flat", "gloo")
LABELS = {"raw": "raw TCP", "hora-hier": "hora hierarchical", "hora-flat": "hora flat", "gloo": "gloo"}
CHUNK = 4 << 20  # bytes per sendall / recv_into call of the raw TCP pair


class Stop(Exception):
    """SIGTERM/SIGHUP to the driver: unwind through the finally blocks like Ctrl-C does."""


# -- rates ---------------------------------------------------------------------------------------------------------
def parse_rate(text: str) -> float:
    """A tc rate ('1gbit', '500mbit', '100mbps') -> bytes per second (tc's units: k/m/g = 1000, bit or bps)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(
            f"rate {text!r} is not a tc rate such as 1gbit, 500mbit or 100mbps (bytes/s)"
        )
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"rate {text!r} must be positive")
    return value / 8 if m.group(3) == "bit" else value


# -- raw TCP pair (runs inside the namespaces) ---------------------------------------------------------------------
def _send(sock: socket.socket, nbytes: int, errors: list[BaseException]) -> None:
    try:
        buf = memoryview(bytearray(b"\x5a" * min(CHUNK, nbytes)))
        left = nbytes
        while left:
            n = min(left, len(buf))
            sock.sendall(buf[:n])
            left -= n
        if sock.recv(1) != b"a":  # the receiver's acknowledgement: everything arrived
            raise ConnectionError("the receiver closed the connection before acknowledging")
    except BaseException as exc:
        errors.append(exc)


def _recv(sock: socket.socket, nbytes: int, errors: list[BaseException]) -> None:
    try:
        buf = memoryview(bytearray(min(CHUNK, nbytes)))
        left = nbytes
        while left:
            got = sock.recv_into(buf, min(left, len(buf)))
            if not got:
                raise ConnectionError(f"the sender closed the connection with {left} bytes outstanding")
            left -= got
        sock.sendall(b"a")
    except BaseException as exc:
        errors.append(exc)


def _transfer(outgoing: list[socket.socket], incoming: list[socket.socket], nbytes: int) -> float:
    """Send ``nbytes`` on each outgoing socket and receive as much on each incoming one, all at once; seconds until
    every byte is received here and acknowledged by the other side."""
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_send, args=(s, nbytes, errors)) for s in outgoing]
    threads += [threading.Thread(target=_recv, args=(s, nbytes, errors)) for s in incoming]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return seconds


def tcp_peer(args: argparse.Namespace) -> int:
    """One end of the raw TCP measurement. The server (inside host b) listens and prints its port; the client
    (inside host a) connects one control socket plus ``streams`` data sockets per direction, and for each mode and
    round both start together (a ping-pong on the control socket) and time their own part; the client reports."""
    k, nbytes, timeout = args.streams, args.nbytes, args.timeout
    if args.tcp_peer == "server":
        server = socket.create_server((args.addr, 0))
        server.settimeout(timeout)
        print(f"PORT {server.getsockname()[1]}", flush=True)
        socks = []
        for _ in range(1 + 2 * k):
            conn, _ = server.accept()
            conn.settimeout(timeout)
            socks.append(conn)
        server.close()
    else:
        socks = [socket.create_connection((args.addr, args.port), timeout=timeout) for _ in range(1 + 2 * k)]
    control, to_server, to_client = socks[0], socks[1 : 1 + k], socks[1 + k :]
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as hora's TCP plane does
    server_side = args.tcp_peer == "server"
    for mode in ("one-way", "both-ways"):
        times = []
        for i in range(1 + args.rounds):  # the first round warms up (untimed)
            if server_side:
                if control.recv(1) != b"g":
                    raise ConnectionError("the client went away")
                control.sendall(b"g")
            else:
                control.sendall(b"g")
                if control.recv(1) != b"g":
                    raise ConnectionError("the server went away")
            if mode == "one-way":
                out, inc = ([], to_server) if server_side else (to_server, [])
            else:
                out, inc = (to_client, to_server) if server_side else (to_server, to_client)
            seconds = _transfer(out, inc, nbytes)
            if i:
                times.append(seconds)
        if not server_side:
            median = float(np.median(times))
            emit(0, {"kind": "tcp", "mode": mode, "streams": k, "bytes_per_stream": nbytes, "rounds": args.rounds,
                     "seconds": median, "GBps": k * nbytes / median / 1e9})  # fmt: skip
    for s in socks:
        s.close()
    if not server_side:
        emit(0, {"kind": "done"})
    return 0


# -- hora and gloo ranks -------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> int:
    """One rank: collectives.py's backend and ``measure`` for allreduce at every size, plus where it ran."""
    import collectives

    backend: collectives.Backend
    where = {"host": os.environ.get("HORA_HOSTNAME", ""), "net_ns": os.readlink("/proc/self/ns/net")}
    if args.worker == "hora":
        backend = collectives.HoraBackend()
        from hora._runtime.context import current

        setup: dict[str, Any] = {
            "plane": type(current().engine._transport).__name__,
            "transport": current().transport,
        }
        ranks = backend.hvd.allgather_object(where, name="bench.where")
    else:
        backend = collectives.GlooBackend()
        setup = {"plane": "gloo"}
        ranks = [None] * backend.size
        backend.dist.all_gather_object(ranks, where)
    emit(backend.rank, {"kind": "start", "framework": args.label, "np": backend.size, "ranks": ranks,
                        **setup, **backend.info()})  # fmt: skip
    for nbytes in args.sizes:
        emit(backend.rank, collectives.measure(backend, "allreduce", nbytes, args))
    backend.barrier()
    emit(backend.rank, {"kind": "done", "framework": args.label})
    backend.close()
    return 0


# -- driver --------------------------------------------------------------------------------------------------------
def netns_exec(name: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", name, *argv]


def apply_rate(cluster: Any, args: argparse.Namespace) -> list[str]:
    """tbf on each host's end of its veth pair; returns what ``tc qdisc show`` says there (for the report)."""
    rate_bps = args.rate_bytes
    burst = args.tbf_burst or f"{max(int(rate_bps * 0.001), 128 << 10)}b"  # rate x 1 ms, >= 2 GSO packets
    shown = []
    for host in cluster.hosts:
        cmd = ["tc", "qdisc", "add", "dev", cluster.bridge, "root", "tbf", "rate", args.rate, "burst", burst,
               "latency", args.tbf_latency]  # fmt: skip
        subprocess.run(netns_exec(host.netns, *cmd), check=True, capture_output=True, text=True, timeout=20)
        out = subprocess.run(netns_exec(host.netns, "tc", "qdisc", "show", "dev", cluster.bridge),
                             check=True, capture_output=True, text=True, timeout=20).stdout  # fmt: skip
        shown.append(f"{host.addr}: {out.strip()}")
    return shown


def remove_rate(cluster: Any) -> None:
    for host in cluster.hosts:
        subprocess.run(netns_exec(host.netns, "tc", "qdisc", "del", "dev", cluster.bridge, "root"),
                       capture_output=True, timeout=20)  # fmt: skip


def sweep(cluster: Any) -> list[str]:
    """End whatever this run left inside the host namespaces (ranks, agents, ssh sessions), by pid: SIGTERM, then
    SIGKILL after 3 s. The fixture's own sshd is left to :meth:`Cluster.close`. Returns what had to be ended."""
    own = {h.pid for h in cluster.hosts}
    left = {pid for h in cluster.hosts for pid in cluster.processes_in(h.netns)} - own
    described = []
    for pid in sorted(left):
        try:
            described.append(
                f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            )
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 3
    while left and time.monotonic() < deadline:
        left = {p for p in left if Path(f"/proc/{p}").exists()}
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return described


def measure_tcp(
    cluster: Any, args: argparse.Namespace, streams: int, nbytes: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The raw TCP pair: server in host b, client in host a; returns the client's records and an error note."""
    a, b = cluster.hosts[0], cluster.hosts[1]
    common = ["--streams", str(streams), "--nbytes", str(nbytes), "--rounds", str(args.tcp_rounds),
              "--timeout", str(args.timeout)]  # fmt: skip
    server = subprocess.Popen(
        netns_exec(b.netns, sys.executable, str(HERE), "--tcp-peer", "server", "--addr", b.addr, *common),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        sel = selectors.DefaultSelector()
        sel.register(server.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        if not sel.select(timeout=60):
            return [], "the raw TCP server did not report its port within 60 s"
        line = server.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("PORT "):
            server.kill()
            return [], f"the raw TCP server failed: {line}{server.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        client = netns_exec(a.netns, sys.executable, str(HERE), "--tcp-peer", "client", "--addr", b.addr,
                            "--port", line.split()[1], *common)  # fmt: skip
        records, error = run_ranks(client, dict(os.environ), args.timeout)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        return records, error
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def system_command(cluster: Any, args: argparse.Namespace, system: str, per_host: int) -> list[str]:
    hosts = ",".join(f"{h.addr}:{per_host}" for h in cluster.hosts)
    cmd = [*hora_command(2 * per_host), "-H", hosts, "--network-interface", cluster.bridge,
           "--start-timeout", "120", *cluster.cli_args()]  # fmt: skip
    if system == "hora-flat":
        cmd += ["--no-hierarchical-allreduce", "--no-hierarchical-allgather"]
    elif system == "hora-hier":
        cmd += ["--hierarchical-allreduce", "--hierarchical-allgather"]
    cmd += [sys.executable, str(HERE), "--worker", "gloo" if system == "gloo" else "hora", "--label", system,
            "--sizes", ",".join(str(s) for s in args.sizes), "--warmup", str(args.warmup),
            "--min-time", str(args.min_time), "--min-iters", str(args.min_iters),
            "--max-iters", str(args.max_iters)]  # fmt: skip
    if args.iters:
        cmd += ["--iters", str(args.iters)]
    return cmd


def table(
    args: argparse.Namespace, per_host: int, tcp: dict[str, Any], results: dict[tuple[str, int], Any]
) -> str:
    n, hosts = 2 * per_host, 2
    link_factor = (2 * (n - 1) / n) / (2 * (hosts - 1) / hosts)  # busbw per unit of cross-host bandwidth
    both = tcp.get("both-ways")
    bound = both["GBps"] * link_factor if both else None
    one = tcp.get("one-way")
    lines = [
        f"### allreduce float32, 2 hosts x {per_host} rank{'s' if per_host > 1 else ''} (N = {n})",
        "",
        f"Raw TCP, {per_host} stream{'s' if per_host > 1 else ''} per direction: "
        + (f"one way {format_gbps(one['GBps'])} GB/s; " if one else "one way —; ")
        + (f"both ways at once {format_gbps(both['GBps'])} GB/s per direction" if both else "both ways —")
        + f". raw TCP column = that x {link_factor:.2g} (the busbw an allreduce moving the minimum cross-host "
        "bytes at raw speed would reach).",
        "",
        "| size | raw TCP busbw | hora hier busbw | hora flat busbw | gloo busbw | hier/raw | flat/raw "
        "| hier/gloo | flat/gloo |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in args.sizes:
        recs = {s: results.get((s, size)) for s in SYSTEMS}

        def bw(rec: dict[str, Any] | None) -> str:
            if rec is None:
                return "—"
            return f"{format_gbps(rec['busbw_GBps'])}" if rec["ok"] else "WRONG RESULT"

        def pct(rec: dict[str, Any] | None) -> str:
            return f"{100 * rec['busbw_GBps'] / bound:.0f} %" if rec and rec["ok"] and bound else "—"

        def times(rec: dict[str, Any] | None, other: dict[str, Any] | None) -> str:
            if not (rec and other and rec["ok"] and other["ok"]):
                return "—"
            return f"{other['time_median_s'] / rec['time_median_s']:.2f}x"

        row = [format_size(size), format_gbps(bound) if bound else "—", *(bw(recs[s]) for s in SYSTEMS),
               pct(recs["hora-hier"]), pct(recs["hora-flat"]),
               times(recs["hora-hier"], recs["gloo"]), times(recs["hora-flat"], recs["gloo"])]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def driver(args: argparse.Namespace) -> int:
    sys.path.append(str(TESTS))
    from support import netns_hosts as netns

    reason = netns.unavailable()
    if reason:
        print(f"crosshost: cannot build namespace hosts: {reason}", file=sys.stderr)
        return 2
    if args.rate and subprocess.run(["which", "tc"], capture_output=True).returncode != 0:
        print("crosshost: --rate needs 'tc' (Debian package iproute2)", file=sys.stderr)
        return 2
    systems = list(SYSTEMS)
    notes: list[str] = []
    if missing := torch_missing():
        systems.remove("gloo")
        notes.append(f"gloo skipped: {missing}")

    def stop(signum: int, frame: object) -> None:
        raise Stop(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    started = time.time()
    tcp_bytes = args.tcp_bytes or (
        int(args.rate_bytes * 2) if args.rate else 1 << 30
    )  # about 2 s when limited
    print(f"# Cross-host allreduce: sizes {', '.join(map(format_size, args.sizes))}; ranks per host "
          f"{', '.join(map(str, args.per_host))}; link {'limited by tc tbf to ' + args.rate if args.rate else 'veth, unlimited'}\n",
          flush=True)  # fmt: skip
    report: dict[str, Any] = {"machine": machine(), "rate": args.rate, "layouts": []}
    cluster = None
    status = 0
    try:
        cluster = netns.start_cluster(2)
        env_note = f"hosts {', '.join(h.addr for h in cluster.hosts)} (namespaces {', '.join(h.netns for h in cluster.hosts)})"
        print(f"Machine: {json.dumps(machine())}; {env_note}\n", flush=True)
        os.environ["GLOO_SOCKET_IFNAME"] = (
            cluster.bridge
        )  # the namespace NIC, for gloo's ranks (hora run forwards it)
        if args.rate:
            report["qdiscs"] = apply_rate(cluster, args)
            print("qdiscs:\n" + "\n".join(f"    {q}" for q in report["qdiscs"]) + "\n", flush=True)
        for per_host in args.per_host:
            print(f"[{time.time() - started:5.0f}s] raw TCP, {per_host} stream(s) per direction, "
                  f"{format_size(tcp_bytes)} per stream", file=sys.stderr, flush=True)  # fmt: skip
            records, error = measure_tcp(cluster, args, per_host, tcp_bytes)
            tcp = {r["mode"]: r for r in records if r["kind"] == "tcp"}
            for r in tcp.values():
                print(f"    {r['mode']}: {r['GBps']:.3f} GB/s per direction", file=sys.stderr, flush=True)
            if error:
                notes.append(f"raw TCP, {per_host} stream(s): {error}")
                print(f"    failed: {error}", file=sys.stderr, flush=True)
            results: dict[tuple[str, int], Any] = {}
            starts: dict[str, Any] = {}
            for system in systems:
                print(f"[{time.time() - started:5.0f}s] {LABELS[system]}, 2 hosts x {per_host}",
                      file=sys.stderr, flush=True)  # fmt: skip

                def progress(rec: dict[str, Any]) -> None:
                    if rec["kind"] == "result":
                        print(f"    {format_size(rec['size']):>5}: busbw {rec['busbw_GBps']:.3f} GB/s "
                              f"({rec['iters']} iters){'' if rec['ok'] else '  WRONG RESULT'}",
                              file=sys.stderr, flush=True)  # fmt: skip

                records, error = run_ranks(system_command(cluster, args, system, per_host), dict(os.environ),
                                           args.timeout, on_record=progress)  # fmt: skip
                for rec in records:
                    if rec["kind"] == "start":
                        starts[system] = rec
                        # every rank must have run inside its host's namespace, half of them on each host
                        expected = [
                            f"net:[{cluster.netns_inode(h.netns)}]"
                            for h in cluster.hosts
                            for _ in range(per_host)
                        ]
                        seen = [w["net_ns"] for w in rec["ranks"]]
                        if seen != expected:
                            notes.append(
                                f"{system}: ranks ran in network namespaces {seen}, expected {expected}"
                            )
                            status = 1
                    elif rec["kind"] == "result":
                        results[(system, rec["size"])] = rec
                        if not rec["ok"]:
                            notes.append(
                                f"{system} at {format_size(rec['size'])}, N={2 * per_host}: wrong result"
                            )
                            status = 1
                if error:
                    notes.append(f"{system}, 2 hosts x {per_host}: {error}")
                    print(f"    failed: {error}", file=sys.stderr, flush=True)
                    if leftovers := sweep(cluster):
                        notes.append(f"ended after {system} failed: " + "; ".join(leftovers))
            planes = ", ".join(f"{LABELS[s]} = {r.get('plane')}" for s, r in starts.items())
            print(table(args, per_host, tcp, results) + f"\nPlanes: {planes}.\n", flush=True)
            report["layouts"].append({"ranks_per_host": per_host, "tcp": list(tcp.values()), "starts": starts,
                                      "results": list(results.values())})  # fmt: skip
    except (KeyboardInterrupt, Stop) as exc:
        notes.append(f"interrupted ({type(exc).__name__} {exc}); results so far are above")
        status = 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        if cluster is not None:
            try:
                if args.rate:
                    remove_rate(cluster)
                if leftovers := sweep(cluster):
                    notes.append("ended at the end of the run: " + "; ".join(leftovers))
            finally:
                cluster.close()
    elapsed = time.time() - started
    finish(notes, elapsed, args.json, {**report, "args": {k: v for k, v in vars(args).items() if k != "worker"}})
    if status == 0 and notes and not any(lay["results"] for lay in report["layouts"]):
        status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"allreduce sizes, K/M/G binary (default {DEFAULT_SIZES})"
    )
    p.add_argument("--per-host", default="1,2", help="ranks per host, one layout each (default 1,2)")
    p.add_argument(
        "--rate", default="", help="limit the link with tc tbf to this rate, e.g. 1gbit (default: none)"
    )
    p.add_argument("--tbf-burst", default="", help="tbf burst (default: rate x 1 ms, at least 128 KiB)")
    p.add_argument("--tbf-latency", default="50ms", help="tbf latency, the queue it allows (default 50ms)")
    p.add_argument("--iters", type=int, default=0, help="fixed timed iterations per size (default: adaptive)")
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed iterations before timing (default 2, at least 1)"
    )
    p.add_argument(
        "--min-time", type=float, default=0.5, help="adaptive: seconds of timed ops to aim for (0.5)"
    )
    p.add_argument("--min-iters", type=int, default=3, help="adaptive: fewest timed iterations (3)")
    p.add_argument("--max-iters", type=int, default=200, help="adaptive: most timed iterations (200)")
    p.add_argument("--tcp-bytes", type=parse_size, default=0,
                   help="raw TCP: bytes per stream per round (default 1G; with --rate about 2 s worth)")  # fmt: skip
    p.add_argument(
        "--tcp-rounds", type=int, default=3, help="raw TCP: timed rounds per mode after one warm-up (3)"
    )
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds one system at one layout may take (600)"
    )
    p.add_argument("--json", metavar="PATH", help="also write every result as JSON")
    p.add_argument("--worker", choices=["hora", "gloo"], help=argparse.SUPPRESS)
    p.add_argument("--label", default="", help=argparse.SUPPRESS)
    p.add_argument("--tcp-peer", choices=["server", "client"], help=argparse.SUPPRESS)
    p.add_argument("--addr", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--streams", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--nbytes", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tcp_peer:
        return tcp_peer(args)
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.worker:
        args.label = args.label or args.worker
        return worker(args)
    try:
        args.per_host = parse_counts(args.per_host, "--per-host")
        args.rate_bytes = parse_rate(args.rate) if args.rate else 0.0
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.tcp_rounds < 1:
        p.error("--tcp-rounds must be at least 1")
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        p.error("--timeout must be a positive number of seconds")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
