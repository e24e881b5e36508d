"""``hora run`` across hosts over SSH, on network-namespace hosts with their own sshd (fixture:
tests/support/netns_hosts.py).

Every job here really runs its remote ranks through ``ssh`` -> ``sshd`` in another network namespace -> the hora
agent; the failure tests check the message, that the launcher ends in bounded time (each job has a hard limit and
must not reach it), and that no process of the job is left on any host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from hora.errors import ConfigError, HostError
from hora.runner import run, run_command
from hora.runner.system_metrics import METRIC_NAMES
from support import netns_hosts as netns
from support import paths
from support.harness import run_failing, run_ranks
from workers.multihost import (
    killed_on_second_host_worker,
    placement_worker,
    ports_worker,
    secret_worker,
    suite_worker,
)

LIMIT = 240.0  # hard limit of each job: a job that reaches it is a hang, and fails the test


def hosts_of(cluster: netns.Cluster, *slots: int) -> str:
    return ",".join(f"{h.addr}:{n}" for h, n in zip(cluster.hosts, slots))


def assert_hosts_clean(cluster: netns.Cluster, job_id: str = "", marker: str = "") -> None:
    """Within a few seconds, no process of the job is left anywhere, and each host runs nothing but its sshd."""
    deadline = time.monotonic() + 20
    while True:
        extra = {h.netns: cluster.processes_in(h.netns) - {h.pid} for h in cluster.hosts}
        jobs = netns.job_processes(job_id, marker) if (job_id or marker) else []
        if not any(extra.values()) and not jobs:
            return
        if time.monotonic() > deadline:
            described = []
            for pid in sorted(set().union(*extra.values()) | {p for p, _ in jobs}):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    described.append(f"{pid}: {cmd!r}")
                except OSError:
                    pass
            pytest.fail("processes left behind on the hosts:\n" + "\n".join(described))
        time.sleep(0.1)


def hora_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hora", "run", *args]


# -- jobs that work -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hierarchical", [True, False], ids=["hierarchical", "flat"])
def test_collective_suite_across_two_ssh_hosts(netns_cluster, hierarchical):
    """Both data planes across real (namespace) hosts pass the same self-checking suite."""
    c = netns_cluster
    flags = {"hierarchical_allreduce": hierarchical, "hierarchical_allgather": hierarchical}
    results = run_ranks(suite_worker, 4, hosts=hosts_of(c, 2, 2), timeout=LIMIT, **c.ssh_kwargs(), **flags)
    for r, res in enumerate(results):
        assert res["allreduce_worker"] > 0 and all(
            res[k] for k in ("allgather_worker", "broadcast_worker", "alltoall_worker", "reducescatter_worker",
                             "object_worker")
        ), res
        where = res["where"]
        host = c.hosts[r // 2]
        assert where["host"] == host.addr and where["bind"] == host.addr, where
        transport = "hierarchical" if hierarchical else "tcp"
        assert where["transport"] == transport and where["hosts"] == sorted(h.addr for h in c.hosts)
        # each rank really ran inside its host's network namespace
        assert where["pid_ns"] == f"net:[{c.netns_inode(host.netns)}]"
    assert_hosts_clean(c)


def test_topology_with_heterogeneous_slots(netns_cluster):
    c = netns_cluster
    infos = run_ranks(placement_worker, 3, hosts=hosts_of(c, 2, 1), timeout=LIMIT, **c.ssh_kwargs())
    expected = [  # (host, local_rank, local_size, cross_rank, cross_size)
        (c.hosts[0].addr, 0, 2, 0, 2),
        (c.hosts[0].addr, 1, 2, 0, 1),
        (c.hosts[1].addr, 0, 1, 1, 2),
    ]
    for r, (info, exp) in enumerate(zip(infos, expected)):
        got = (info["host"], info["local_rank"], info["local_size"], info["cross_rank"], info["cross_size"])
        assert got == exp, (r, info)
        assert info["rank"] == r and info["size"] == 3 and info["homogeneous"] is False
        env = info["env"]
        assert (env["HOROVOD_LOCAL_RANK"], env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == tuple(
            str(x) for x in exp[1:2] + exp[3:]
        )
        assert env["LOCAL_WORLD_SIZE"] == str(exp[2]) and env["MASTER_ADDR"] == c.hosts[0].addr
        host = c.hosts[0 if r < 2 else 1]
        assert info["transport"] == "hierarchical" and info["net_ns"] == f"net:[{c.netns_inode(host.netns)}]"
    assert_hosts_clean(c)


def test_cli_hostfile_interface_and_prefixed_output(netns_cluster, tmp_path):
    c = netns_cluster
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# the two namespace hosts\n{c.hosts[0].addr} slots=1\n\n{c.hosts[1].addr}:2  # two\n")
    code = (
        "import os, hora.numpy as hvd, numpy as np; hvd.init(); "
        "s = hvd.allreduce(np.array([hvd.rank()]), op=hvd.Sum)[0]; "
        "print('rank', hvd.rank(), 'on', os.environ['HORA_HOSTNAME'], 'bind', os.environ.get('HORA_BIND_ADDR'), "
        "'sum', s, flush=True); import sys; print('then err', hvd.rank(), file=sys.stderr)"
    )
    proc = subprocess.run(
        hora_cli("--hostfile", str(hostfile), "--network-interface", c.bridge, "--start-timeout", "60",
                 "--merge-stderr-to-stdout", "--system-metrics", "system.jsonl", "--system-metrics-interval", "0.1",
                 *c.cli_args(), sys.executable, "-c", code),
        capture_output=True, text=True, timeout=LIMIT, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # each host's agent sampled its own network namespace and sent the samples back through its SSH session
    samples = [json.loads(line) for line in (tmp_path / "system.jsonl").read_text().splitlines()]
    by_host = {h.addr: [s for s in samples if s["host"] == h.addr] for h in c.hosts}
    for host, got in by_host.items():
        assert {s["name"] for s in got} == set(METRIC_NAMES), (host, got)
        assert any(s["name"] == "network_transmit_bytes_per_second" and s["value"] > 0 for s in got), (host, got)
    assert {s["host"] for s in samples} == {*by_host, socket.gethostname()}  # and the launching host its own
    lines = proc.stdout.splitlines()
    for r, host in enumerate([c.hosts[0], c.hosts[1], c.hosts[1]]):
        # the agent resolved --network-interface on each host to that host's own address
        assert f"[{r}]<stdout>: rank {r} on {host.addr} bind {host.addr} sum 3" in lines, proc.stdout
        # the agents gave each rank one pipe: its stderr line follows its stdout line, on stdout
        first = lines.index(f"[{r}]<stdout>: rank {r} on {host.addr} bind {host.addr} sum 3")
        assert lines.index(f"[{r}]<stdout>: then err {r}") > first, proc.stdout
    assert "<stderr>" not in proc.stderr, proc.stderr
    assert_hosts_clean(c)


def test_secret_never_appears_on_a_command_line(netns_cluster, tmp_path):
    c = netns_cluster
    outcome: dict[str, object] = {}

    def job() -> None:
        try:
            outcome["results"] = run(secret_worker, (str(tmp_path),), np=4, hosts=hosts_of(c, 2, 2), capture=True,
                                     timeout=LIMIT, **c.ssh_kwargs())
        except BaseException as exc:  # reported by the test thread
            outcome["error"] = exc

    t = threading.Thread(target=job)
    t.start()
    try:
        deadline = time.monotonic() + LIMIT
        while not all((tmp_path / f"secret.{r}").exists() for r in range(4)):
            assert t.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.05)
        secret = (tmp_path / "secret.0").read_text().strip()
        assert len(secret) >= 64 and all((tmp_path / f"secret.{r}").read_text().strip() == secret for r in range(4))
        cmdlines = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    pass
        # the scan saw the SSH clients and the remote agents (so it looked where a leak would be)...
        agents = [p for p, cmd in cmdlines.items() if "hora.runner.host_agent" in cmd]
        assert sum("hora.runner.host_agent" in cmd and cmd.startswith("ssh") for cmd in cmdlines.values()) == 2
        assert len(agents) >= 4, cmdlines  # two ssh clients + two agents (+ the remote login shells' exec)
        # ...and the secret is on no command line, nor in the environment of the ssh clients or the agents
        assert not [p for p, cmd in cmdlines.items() if secret in cmd]
        for pid in agents:
            try:
                assert secret.encode() not in Path(f"/proc/{pid}/environ").read_bytes(), pid
            except OSError:
                pass
    finally:
        (tmp_path / "go").write_text("")
        t.join(LIMIT)
    assert "error" not in outcome, outcome
    assert outcome["results"] == [True] * 4
    assert_hosts_clean(c)


def test_several_loopback_hosts_run_locally_without_ssh(monkeypatch, tmp_path):
    # Each loopback "host" is a group of its own, bound to its own address, started without SSH: an 'ssh' first on
    # PATH that leaves a mark and fails proves it is never called.
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ssh-was-called'}\nexit 255\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    infos = run_ranks(placement_worker, 4, hosts="127.0.0.2:2,127.0.0.3:2", timeout=LIMIT)
    assert not (tmp_path / "ssh-was-called").exists()
    for r, info in enumerate(infos):
        addr = "127.0.0.2" if r < 2 else "127.0.0.3"
        assert (info["host"], info["bind"], info["hora_hostname"]) == (addr, addr, addr)
        assert (info["local_rank"], info["local_size"], info["cross_rank"], info["cross_size"]) == (r % 2, 2, r // 2, 2)
        assert info["transport"] == "hierarchical"


def test_port_range_bounds_the_ranks_listeners(netns_cluster):
    c = netns_cluster
    results = run_ranks(ports_worker, 4, hosts=hosts_of(c, 2, 2), timeout=LIMIT, port_range="41000-41003",
                        **c.ssh_kwargs())
    ports = results[0]
    assert all(r == ports for r in results)
    assert all(41000 <= p <= 41003 for p in ports), ports
    assert len(set(ports[:2])) == 2 and len(set(ports[2:])) == 2  # two ranks per host: two ports per host


# -- failures ---------------------------------------------------------------------------------------------------------
def _host_error(hosts: str, **kwargs) -> str:
    with pytest.raises(HostError) as info:
        run_command(["true"], hosts=hosts, capture=True, timeout=LIMIT, start_timeout=5, **kwargs)
    return str(info.value)


def test_unreachable_host_fails_fast_naming_it(netns_cluster):
    c = netns_cluster
    message = _host_error(f"{c.hosts[0].addr}:1,{c.unreachable}:1", **c.ssh_kwargs())
    assert "1 of 2 remote host(s) failed the SSH check" in message
    assert f"host {c.unreachable}: " in message and ("unreachable" in message or "cannot reach" in message), message
    assert f"host {c.hosts[0].addr}:" not in message  # the good host is not blamed
    assert_hosts_clean(c)


def test_black_hole_host_times_out_naming_it(netns_cluster):
    c = netns_cluster
    message = _host_error(f"{c.blackhole.addr}:2", **c.ssh_kwargs())
    assert f"host {c.blackhole.addr}: accepted the TCP connection on port 22 but the SSH server never answered" in message
    assert_hosts_clean(c)


def test_wrong_key_is_an_authentication_failure(netns_cluster):
    c = netns_cluster
    message = _host_error(hosts_of(c, 1, 1), **c.ssh_kwargs(c.wrong_key))
    for h in c.hosts:
        assert f"host {h.addr}: SSH authentication failed" in message and "-i/--ssh-identity-file" in message
    assert_hosts_clean(c)


def test_unknown_host_key_is_refused_not_trusted(netns_cluster, tmp_path):
    c = netns_cluster
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    options = [f"UserKnownHostsFile={empty}", "StrictHostKeyChecking=yes"]
    message = _host_error(hosts_of(c, 1), ssh_identity_file=c.key, ssh_options=options)
    assert f"host {c.hosts[0].addr}: its SSH host key is unknown or has changed" in message and "ssh-keyscan" in message
    assert empty.read_text() == ""  # nothing was added behind the user's back


def test_network_interface_that_does_not_exist():
    with pytest.raises(ConfigError, match=r"--network-interface: network interface 'nonexistent0' does not exist"):
        run_command(["true"], np=2, network_interface="nonexistent0")


def test_interface_address_of_loopback():
    from hora.runner.agent_protocol import interface_address

    assert interface_address("lo") == "127.0.0.1"


def test_refused_connection_names_the_port(netns_cluster):
    c = netns_cluster
    message = _host_error(hosts_of(c, 1), ssh_port=2222, **c.ssh_kwargs())
    assert f"host {c.hosts[0].addr}: connection refused on port 2222" in message


def test_np_larger_than_the_slots_of_remote_hosts(netns_cluster):
    c = netns_cluster
    with pytest.raises(ConfigError, match=r"-np 5 is more than the 3 slots given by -H"):
        run_command(["true"], np=5, hosts=hosts_of(c, 2, 1), **c.ssh_kwargs())


def test_worker_killed_on_the_second_host_stops_every_rank(netns_cluster):
    c = netns_cluster
    result = run_failing(killed_on_second_host_worker, 4, hosts=hosts_of(c, 2, 2), timeout=LIMIT, **c.ssh_kwargs())
    rc = result.root_cause
    assert rc is not None and (rc.rank, rc.host, rc.returncode) == (3, c.hosts[1].addr, -signal.SIGKILL), result.report()
    assert result.exit_code == 128 + signal.SIGKILL
    assert all(code is not None for code in result.returncodes)
    assert "rank 3 failed first" in result.report() and f"host  : {c.hosts[1].addr}" in result.report()
    assert_hosts_clean(c, result.job_id)


def test_the_report_shows_where_a_stuck_remote_rank_was(netns_cluster):
    """Rank 1 freezes on the second host: its host's agent takes its stack (and the others') before the kill."""
    c = netns_cluster
    before = set(Path(tempfile.gettempdir()).glob("hora-stacks-agent-*"))
    command = [sys.executable, str(paths.SCRIPTS / "frozen_rank.py")]
    result = run_command(command, np=3, hosts=hosts_of(c, 1, 2), capture=True, timeout=LIMIT, op_timeout=2,
                         grace_period=2, **c.ssh_kwargs())  # fmt: skip
    assert result.exit_code == 1, result.report()
    assert "in think_hard" in result.stacks[1]  # through the agent of the host it ran on
    assert f"rank 1: {paths.SCRIPTS / 'frozen_rank.py'}:13 in think_hard" in result.report()
    assert_hosts_clean(c, result.job_id)
    assert set(Path(tempfile.gettempdir()).glob("hora-stacks-agent-*")) <= before  # each agent removed its own


def _start_sleeping_job(c: netns.Cluster, marker: str) -> subprocess.Popen[str]:
    """``hora run`` of 4 ranks on two hosts, with a parameter server on each (started by the hosts' agents, they must
    go with the job too), returned once every rank has initialised and sleeps."""
    code = "import sys, time, hora.numpy as hvd; hvd.init(); print('ready', flush=True); time.sleep(600)"
    proc = subprocess.Popen(
        hora_cli("-H", hosts_of(c, 2, 2), "--ps-per-host", "1", *c.cli_args(), sys.executable, "-c", code, marker),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + LIMIT
    ready = 0
    assert proc.stdout is not None
    while ready < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        ready += "ready" in line
    if ready < 4:
        proc.kill()
        proc.wait()
        pytest.fail(f"the job did not start: {proc.stderr.read()}")  # type: ignore[union-attr]
    assert len([pid for pid, _ in netns.job_processes("", marker) if pid != proc.pid]) == 4
    while not all(_runs_a_server(c, h) for h in c.hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_runs_a_server(c, h) for h in c.hosts)
    return proc


def _runs_a_server(c: netns.Cluster, host: netns.Host) -> bool:
    for pid in c.processes_in(host.netns):
        try:
            if b"-m\0hora.ps\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def test_launcher_killed_with_sigkill_leaves_nothing_on_any_host(netns_cluster):
    # No chance to clean up: the ssh clients die with it (PR_SET_PDEATHSIG), each agent sees its stdin close and
    # stops its ranks.
    c = netns_cluster
    marker = f"hora-sigkill-{uuid.uuid4().hex[:8]}"
    proc = _start_sleeping_job(c, marker)
    proc.kill()
    proc.wait(timeout=60)
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    assert_hosts_clean(c, marker=marker)


def test_lost_host_is_reported_and_the_rest_of_the_job_stopped(netns_cluster):
    # SIGKILL the agent on the second host: its ranks die with it (PR_SET_PDEATHSIG), its SSH session ends, and the
    # launcher reports the host as lost and stops the ranks on the first host.
    c = netns_cluster
    marker = f"hora-lost-{uuid.uuid4().hex[:8]}"
    proc = _start_sleeping_job(c, marker)
    try:
        second = c.processes_in(c.hosts[1].netns)
        agents = [pid for pid in second if b"hora.runner.host_agent" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(agents) == 1, agents
        os.kill(agents[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 255, stderr
    assert f"why   : lost the connection to host {c.hosts[1].addr} (ssh exited with 255" in stderr, stderr
    assert f"host  : {c.hosts[1].addr}" in stderr
    # the first host's ranks were asked for their stacks through its agent; hora run keeps them for the user
    kept = re.search(r"where the ranks still running were \(all threads: (\S+)\):", stderr)
    assert kept is not None, stderr
    shutil.rmtree(kept.group(1))
    for stale in Path(tempfile.gettempdir()).glob(f"hora-stacks-agent-{agents[0]}-*"):  # the killed agent's own
        shutil.rmtree(stale)  # (the next agent's start would sweep it)
    assert_hosts_clean(c, marker=marker)


def test_remote_command_that_cannot_start_names_the_host(netns_cluster, tmp_path):
    c = netns_cluster
    result = run_command([str(tmp_path / "no-such-program")], hosts=hosts_of(c, 1, 1), capture=True, timeout=LIMIT,
                         **c.ssh_kwargs())
    assert result.exit_code == 1 and result.root_cause is not None
    assert result.root_cause.host in (c.hosts[0].addr, c.hosts[1].addr)
    assert f"cannot start '{tmp_path / 'no-such-program'}': No such file or directory" in result.root_cause.reason
    assert "why   : host " in result.report()
    assert_hosts_clean(c)


def test_sigint_to_the_launcher_stops_every_rank_on_every_host(netns_cluster):
    c = netns_cluster
    marker = f"hora-sigint-{uuid.uuid4().hex[:8]}"
    proc = _start_sleeping_job(c, marker)
    try:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGINT and "interrupted by SIGINT; stopped every rank" in stderr, stderr
    assert_hosts_clean(c, marker=marker)
