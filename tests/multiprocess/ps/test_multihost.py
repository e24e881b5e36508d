"""``hora run -H a,b --ps-per-host 1`` on a real second host (a network namespace with its own sshd, reached over
SSH): one server on the launcher's machine, one started by the remote host's agent; the workers of both hosts
push and pull through both (shared memory to their own host's server, TCP to the other's), the values agree with
numpy, and every server is gone when the job ends."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from hora.runner import run_command
from hora.runner.ps_servers import server_key
from support import netns_hosts as netns
from support.harness import run_failing, stderr_of
from workers.ps import restarted_server_worker
from workers.ps_hosts import STEPS, killed_server

LIMIT = 240.0  # hard limit of the job: reaching it is a hang, and fails the test


def _alive(pid: int) -> bool:
    try:
        return ") Z" not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False


def test_one_server_per_host_serves_the_workers_of_every_host(netns_cluster):
    c = netns_cluster
    remote = c.hosts[0]
    hosts = [c.root_addr, remote.addr]  # the launcher's machine (its bridge address) and a host over SSH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = run_command(
        [sys.executable, "-c", "from workers.ps_hosts import main; main()"], 4, hosts=f"{hosts[0]}:2,{hosts[1]}:2",
        env=env, capture=True, timeout=LIMIT, ps_per_host=1, log_level="info", port_range="41200-41215",
        **c.ssh_kwargs(),
    )  # fmt: skip
    dump = result.lines
    assert result.exit_code == 0, f"{result.report()}\n{dump}"
    outs = [json.loads(line[len("RESULT "):]) for r in range(4) for line in result.lines[r]["stdout"]
            if line.startswith("RESULT ")]  # fmt: skip
    assert [o["rank"] for o in outs] == [0, 1, 2, 3], dump
    here = os.readlink("/proc/self/ns/net")
    there = f"net:[{c.netns_inode(remote.netns)}]"
    expected_v = np.full((8, 3), STEPS * (1 + 2 + 3 + 4), np.float32)
    rows = expected_v.copy()
    rows[:4] += 1  # each rank pushed 1 into its own row
    rows[7] += 2 * 4  # and 1 twice (a duplicate id) into row 7
    for o in outs:
        assert o["size"] == 4  # the servers are not ranks
        host = hosts[o["rank"] // 2]
        assert o["host"] == host and o["net_ns"] == (here if host == hosts[0] else there)
        np.testing.assert_allclose(o["w"], o["reference"], rtol=1e-12)  # sgd over the mean of 4 gradients
        np.testing.assert_array_equal(o["v"], expected_v)
        np.testing.assert_array_equal(o["rows"], rows)
        assert o["placement"] == {"w": [0, 1], "v": [0, 1]}  # each variable on both servers, both hosts
        # server i on host i, bound to that host's address, in that host's network namespace
        assert [(s["host"], s["hostname"]) for s in o["servers"]] == [(h, h) for h in hosts], o["servers"]
        assert all(41200 <= s["port"] <= 41215 for s in o["servers"])  # HORA_PORT_RANGE holds for servers too
        assert o["server_net_ns"] == [here, there]
        # shared memory to the server of the worker's own host, TCP to the other
        assert o["shm"] == [host == hosts[0], host == hosts[1]]
    assert outs[0]["servers"] == outs[3]["servers"]
    # the servers' output came back prefixed as psI (ps1 through the remote host's agent)
    for i, host in enumerate(hosts):
        lines = result.lines[-1 - i]["stderr"]
        assert any(line.startswith(f"[ps{i}] INFO serving at {host}:") and f"on host {host} for 4 workers" in line
                   for line in lines), lines  # fmt: skip
    # every server is gone with the job, on both hosts, and nothing else of the job is left anywhere
    pids = [int(s["pid"]) for s in outs[0]["servers"]]
    deadline = time.monotonic() + 20
    while (
        left := [p for p in pids if _alive(p)] + netns.job_processes(result.job_id)
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left
    assert c.processes_in(remote.netns) - {remote.pid} == set()


def test_a_killed_remote_server_is_reported_by_the_launcher_and_fails_every_worker(netns_cluster, capfd):
    c = netns_cluster
    remote = c.hosts[0]
    result = run_failing(killed_server, 2, hosts=f"{remote.addr}:1,{c.root_addr}:1", timeout=LIMIT, ps_per_host=1,
                         **c.ssh_kwargs())  # fmt: skip
    # the root cause is the server (its host's agent reported it); the first rank to step again fails naming the
    # server, its address and its shard; the job stops
    rc = result.root_cause
    assert rc is not None and (rc.label, rc.host, rc.exit_code) == ("parameter server 0", remote.addr, 137), rc
    err = "\n".join(stderr_of(result, r) for r in range(2))
    assert f"PeerLostError: parameter server 0 at {remote.addr}:" in err and "'emb' shard 0" in err, err[-2000:]
    launcher = capfd.readouterr().err
    assert re.search(rf"hora run: parameter server 0 \(pid \d+\) on host {re.escape(remote.addr)} exited with -9 "
                     "while the workers were running", launcher), launcher[-3000:]  # fmt: skip
    assert "parameter server 1" not in launcher  # the other one was stopped with the job, not reported
    deadline = time.monotonic() + 20
    while (left := netns.job_processes(result.job_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def test_a_remote_server_restarts_from_its_checkpoint_through_its_hosts_agent(netns_cluster, capfd, tmp_path):
    """``--max-restarts`` with the server on the SSH host: its agent restarts it from DIR/ps0 when SIGKILLed (the
    workers of both hosts go on, sync training ends at the sequential reference), kills it when frozen past the last
    restart, and gives it up, so every worker fails naming it; nothing is left on either host."""
    c = netns_cluster
    remote = c.hosts[0]
    every, steps = 4, 10
    result = run_failing(
        restarted_server_worker, 2, str(tmp_path), every, steps, hosts=f"{remote.addr}:1,{c.root_addr}:1",
        timeout=LIMIT, ps_per_host=1, ps_max_restarts=1, ps_checkpoint_dir=str(tmp_path),
        ps_checkpoint_steps=every, op_timeout=300.0, **c.ssh_kwargs(),
    )  # fmt: skip
    for rank in range(2):
        out = [line for line in result.lines[rank]["stdout"] if line.startswith("RESULT ")]
        assert out, stderr_of(result, rank)[-3000:]
        report = json.loads(out[0][len("RESULT ") :])
        assert report["same"] == {"a": True, "b": True}, report
        assert report["reconnects"] >= 1
        err = stderr_of(result, rank)
        assert f"PeerLostError: parameter server 0 at {remote.addr}:" in err, err[-3000:]
        assert "--max-restarts 1" in err and "stopped (SIGSTOP)" in err and "'a' shard" in err, err[-3000:]
    restarted = "\n".join(result.lines[server_key(0, 1)]["stderr"])  # [ps0.restart1], through the agent
    assert "restart 1, restored 2 shard(s)" in restarted, restarted
    launcher = capfd.readouterr().err
    where = rf"hora run: parameter server 0 \(pid \d+\) on host {re.escape(remote.addr)}"
    assert re.search(rf"{where} exited with -9 while the workers were running; restarting it from its last "
                     r"checkpoint \(restart 1 of 1, --max-restarts\)", launcher), launcher[-3000:]  # fmt: skip
    assert re.search(rf"{where} was stopped \(SIGSTOP\) for 2s and killed while the workers were running; hora run "
                     r"gave it up after 1 restart\(s\) \(--max-restarts 1\)", launcher), launcher[-3000:]  # fmt: skip
    deadline = time.monotonic() + 20
    while (left := netns.job_processes(result.job_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left
    assert c.processes_in(remote.netns) - {remote.pid} == set()
