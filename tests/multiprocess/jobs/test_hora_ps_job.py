"""``distribution: {parameter_server: {enabled: true, servers: hora}}``: per host one worker (the script) and one
hora.ps server, started by the master's hora run (``--ps-per-host 1``); the script reaches them with
``hora.ps.connect()``, with no TF_CONFIG and no TensorFlow task, and the servers are gone with the job."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from hora.jobs import JobStore, parse_spec, start_job

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import hora.numpy as hvd
    import hora.ps
    from hora._runtime import context
    from hora.ps.directory import open_store, server_info

    hvd.init()
    config = context.current().config
    store, _ = open_store(config, hvd.rank())
    servers = server_info(store, config.num_ps, 60.0)
    store.close()
    with hora.ps.connect(consistency="sync", partitioner=hora.ps.FixedShardsPartitioner(2)) as ps:
        ps.register("w", np.zeros((4, 2), np.float32), rule="sum")
        for _ in range(3):
            w = ps.push_pull("w", np.full((4, 2), hvd.rank() + 1, np.float32))
        seen = {"size": hvd.size(), "w": w.tolist(), "placement": [s for _, _, s in ps.placement("w")],
                "shm": ps.shared_memory, "servers": servers, "tf_config": os.environ.get("TF_CONFIG"),
                "host": os.environ["SM_CURRENT_HOST"]}
    hvd.shutdown()
    out = sys.argv[sys.argv.index("--out") + 1]
    with open(os.path.join(out, seen["host"] + ".json"), "w") as f:
        json.dump(seen, f)
""")


def _alive(pid: int) -> bool:
    try:
        return ") Z" not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("network", ["auto", "loopback"])  # auto: a network namespace per host where root
def test_servers_hora_runs_one_hora_ps_server_and_one_worker_per_host(tmp_path, network):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "train.py").write_text(SCRIPT)
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": "hora-ps", "instance_count": 2,
                       "distribution": {"parameter_server": {"enabled": True, "servers": "hora"}},
                       "hyperparameters": {"out": str(out)}, "max_run": 240, "network": network})  # fmt: skip
    record = start_job(spec, JobStore(tmp_path / "home"), wait=True, echo=False)
    logs = "\n".join(p.read_text() for p in sorted((Path(record.job_dir) / "logs").glob("*.log")))
    assert record.status == "Completed", f"{record.failure_reason}\n{logs[-4000:]}"
    hosts = ["algo-1", "algo-2"]
    seen = {h: json.loads((out / f"{h}.json").read_text()) for h in hosts}
    plan = json.loads((Path(record.job_dir) / "hora" / "plan.json").read_text())
    for host, got in seen.items():
        # the servers are not ranks, and there is no TensorFlow cluster
        assert got["size"] == 2 and got["tf_config"] is None
        assert got["w"] == [[9.0, 9.0]] * 4  # 3 steps of (1 + 2), summed in sync
        assert got["placement"] == [0, 1]  # the variable's shards on both hosts' servers
        assert [s["hostname"] for s in got["servers"]] == hosts  # server i on host algo-(i+1)
        if plan["network"] == "namespace":  # shared memory to its own host's server only
            assert got["shm"] == [host == "algo-1", host == "algo-2"]
        else:  # loopback addresses (no root): every "host" is this machine, and the addresses say so
            assert got["shm"] == [True, True]
    assert seen["algo-1"]["servers"] == seen["algo-2"]["servers"]
    addresses = [s["host"] for s in seen["algo-1"]["servers"]]
    if plan["network"] == "namespace":  # each server bound to its host's address
        assert addresses == plan["addresses"]
    else:  # hora run's interface on loopback hosts is lo: 127.0.0.1, which every "host" reaches
        assert addresses == ["127.0.0.1", "127.0.0.1"]
    assert "one worker and one hora parameter server (hora.ps) per host" in logs
    for server in seen["algo-1"]["servers"]:
        assert not _alive(int(server["pid"])), server  # stopped with the job
    # nothing of the job runs on: every process of it works in the job's directory
    leftovers = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and _alive(int(entry.name)):
            try:
                if os.readlink(entry / "cwd").startswith(record.job_dir):
                    leftovers.append((entry / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                pass
    assert leftovers == []
