"""The command agent of a job's hosts on a Ray cluster (hora.jobs.command_agent) and its client, ``python -m
hora.jobs._ray_rsh`` (hora run's ``SshOptions.agent``), without Ray: an agent in this process on 127.0.0.1, the client
as a real process against a job directory that names it. Exit statuses and streams pass as ssh passes them, a wrong
secret or an oversized frame is refused before anything runs, and a client that goes away (killed, or silent) takes
its command's process group down."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hora._runtime.auth import Role, client_handshake, new_secret
from hora.jobs import command_agent
from hora.jobs.command_agent import FRAME, MAX_FRAME, REQUEST, CommandAgent
from hora.jobs.store import write_private
from support.ray_cluster import alive, settle

LIMIT = 60.0


@pytest.fixture
def agent(tmp_path):
    secret = new_secret()
    agent = CommandAgent(secret, "127.0.0.1", env=dict(os.environ), cwd=str(tmp_path))
    port = agent.start()
    job = tmp_path / "job"
    write_private(job / "hora" / "agent-secret", secret.hex())
    where = {"address": "127.0.0.1", "port": port, "node_id": "f" * 56, "hostname": "node"}
    write_private(job / "hora" / "ray-hosts.json", json.dumps({"hosts": {"ray-ffffffffffff": where}}))
    try:
        yield agent, job, secret
    finally:
        agent.close()


def _rsh(job: Path, command: str, data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "hora.jobs._ray_rsh", str(job), "ray-ffffffffffff", command],
                          input=data, capture_output=True, timeout=LIMIT)


def test_exit_statuses_and_streams_pass_as_over_ssh(agent, tmp_path):
    _, job, _ = agent
    done = _rsh(job, 'echo out; echo err >&2; echo "$SSH_CONNECTION"; pwd; exit 7')
    assert done.returncode == 7
    out = done.stdout.decode().splitlines()
    assert out[0] == "out" and done.stderr == b"err\n"
    client, _, server, _ = out[1].split()  # as sshd sets it: hora run's host check reads this machine's address
    assert client == server == "127.0.0.1"
    assert out[2] == str(tmp_path)  # the agent's directory (a node's: its home)
    assert _rsh(job, "kill -TERM $$").returncode == 128 + signal.SIGTERM  # killed by a signal: 128 + N, as ssh


def test_stdin_is_forwarded_to_the_command_and_its_end_closes_the_commands(agent):
    _, job, _ = agent
    data = os.urandom(3 << 20)  # many frames each way
    done = _rsh(job, "cat", data)
    assert done.returncode == 0 and done.stdout == data
    assert _rsh(job, "wc -c").stdout.strip() == b"0"  # no stdin: the command sees its end at once


def test_a_wrong_secret_is_refused_before_anything_runs(agent, tmp_path):
    server, job, _ = agent
    write_private(job / "hora" / "agent-secret", new_secret().hex())
    marker = tmp_path / "ran"
    done = _rsh(job, f"touch {marker}")
    assert done.returncode == 255
    assert b"hora job: host ray-ffffffffffff (Ray node 127.0.0.1, node id " in done.stderr
    assert b"rejected this process's credentials" in done.stderr, done.stderr
    assert not marker.exists()
    assert settle(lambda: server.rejects.count != 1, 5) is False


def _authenticated(port: int, secret: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=LIMIT)
    client_handshake(sock, secret, Role.AGENT, 0, 10.0)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(LIMIT)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_an_oversized_frame_is_refused_before_it_is_read(agent, tmp_path, caplog):
    server, _, secret = agent
    marker = tmp_path / "ran"
    with _authenticated(server.port, secret) as sock:
        sock.sendall(FRAME.pack(REQUEST, MAX_FRAME + 1) + json.dumps({"command": f"touch {marker}"}).encode())
        assert _closed_by_peer(sock)
    assert settle(lambda: server.rejects.count != 1, 5) is False
    assert f"announced a frame of {MAX_FRAME + 1} bytes, above the limit of {MAX_FRAME}" in caplog.text
    # and bytes that are no handshake at all
    with socket.create_connection(("127.0.0.1", server.port), timeout=LIMIT) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(200))
        assert _closed_by_peer(sock)
    assert settle(lambda: server.rejects.count != 2, 5) is False
    assert not marker.exists()


def _pids(text: bytes) -> list[int]:
    return [int(x) for x in text.split()]


def test_a_client_killed_takes_its_commands_process_group_down(agent):
    _, job, _ = agent
    proc = subprocess.Popen([sys.executable, "-m", "hora.jobs._ray_rsh", str(job), "ray-ffffffffffff",
                             "sleep 600 & echo $$ $!; wait"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    pids = _pids(proc.stdout.readline())  # the shell and its child, one process group on the "node"
    assert len(pids) == 2 and all(alive(p) for p in pids)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert settle(lambda: [p for p in pids if alive(p)], 15) == []


def test_a_client_that_falls_silent_is_taken_as_lost(agent, monkeypatch):
    server, _, secret = agent
    monkeypatch.setattr(command_agent, "LOST_AFTER", 1.0)  # the agent's patience (15 s) for this test
    with _authenticated(server.port, secret) as sock:
        body = json.dumps({"command": "sleep 600 & echo $$ $!; wait"}).encode()
        sock.sendall(FRAME.pack(REQUEST, len(body)) + body)  # then neither stdin nor PINGs: a client gone quiet
        kind, length = FRAME.unpack(sock.recv(FRAME.size, socket.MSG_WAITALL))
        pids = _pids(sock.recv(length, socket.MSG_WAITALL))
        assert kind == command_agent.STDOUT and all(alive(p) for p in pids)
        assert settle(lambda: [p for p in pids if alive(p)], 15) == []
        deadline = time.monotonic() + LIMIT
        frames = []
        while time.monotonic() < deadline:  # it still says how the command ended, should the client listen
            kind, length = FRAME.unpack(sock.recv(FRAME.size, socket.MSG_WAITALL))
            frames.append((kind, sock.recv(length, socket.MSG_WAITALL) if length else b""))
            if kind == command_agent.EXIT:
                break
        assert frames[-1] == (command_agent.EXIT, struct.pack("!i", -signal.SIGTERM))


AGENT = """
import sys, time
from hora.jobs.command_agent import CommandAgent
agent = CommandAgent(bytes.fromhex(sys.stdin.readline().strip()), "127.0.0.1", env={"PATH": "/usr/bin:/bin"}, cwd="/")
print(agent.start(), flush=True)
time.sleep(600)
"""


def test_an_agent_that_falls_silent_is_given_up_and_its_commands_die_with_it(tmp_path):
    secret = new_secret()
    proc = subprocess.Popen([sys.executable, "-c", AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    client = None
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(secret.hex() + "\n")
        proc.stdin.flush()
        port = int(proc.stdout.readline())
        job = tmp_path / "job"
        write_private(job / "hora" / "agent-secret", secret.hex())
        where = {"address": "127.0.0.1", "port": port, "node_id": "e" * 56, "hostname": "node"}
        write_private(job / "hora" / "ray-hosts.json", json.dumps({"hosts": {"ray-eeeeeeeeeeee": where}}))
        client = subprocess.Popen([sys.executable, "-m", "hora.jobs._ray_rsh", str(job), "ray-eeeeeeeeeeee",
                                   "echo $$; exec sleep 600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert client.stdout is not None
        command = int(client.stdout.readline())
        os.kill(proc.pid, signal.SIGSTOP)  # a hung node: its kernel still answers, its agent says nothing
        _, err = client.communicate(timeout=LIMIT)
        assert client.returncode == 255
        assert (f"host ray-eeeeeeeeeeee (Ray node 127.0.0.1, node id {'e' * 56}): no word from its agent for "
                f"{command_agent.LOST_AFTER:g}s (the node is lost or cut off)").encode() in err, err
        assert alive(command)
        proc.kill()  # the node's end (its actor killed): the command dies with its agent
        assert settle(lambda: alive(command), 15) is False
    finally:
        for p in (proc, client):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()
