"""How the supervisor of a job on a Ray cluster reaches its hosts: ``python -m hora.jobs._ray_rsh JOB_DIR HOST
COMMAND``, used by hora run (and :mod:`hora.jobs.remote_hosts`) in place of ``ssh HOST COMMAND``
(``SshOptions.agent``).

It finds the host's command agent (:mod:`hora.jobs.command_agent`, run by the host's actor on its Ray node) in the
job's ``hora/ray-hosts.json``, connects, authenticates with the job's agent secret (``hora/agent-secret``, 0600),
hands over the shell command, forwards its own stdin and writes the command's stdout and stderr to its own, and
exits with the command's exit status: 255, like ssh, when the host cannot be reached or is lost (no word from it
for ``LOST_AFTER`` seconds), with a line naming the host and its Ray node. Killing it ends the command on the
node, as closing an SSH session does.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
from pathlib import Path

from hora._runtime.auth import Role, client_handshake
from hora.errors import HoraError
from hora.jobs.command_agent import (
    CHUNK,
    EXIT,
    HANDSHAKE_SECONDS,
    LOST_AFTER,
    PING,
    REQUEST,
    STDERR,
    STDIN,
    STDIN_EOF,
    STDOUT,
    beat,
    keepalive,
    recv_frame,
    send_frame,
    wait_readable,
)
from hora.jobs.records import unreachable

#: Seconds to wait for the TCP connection to a host's agent.
CONNECT_SECONDS = 10.0
HOSTS_FILE = "ray-hosts.json"
SECRET_FILE = "agent-secret"



def _write(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # our reader went away: the rest of the stream is dropped, the exit status still comes


def _forward_stdin(sock: socket.socket, lock: threading.Lock) -> None:
    try:
        while True:
            data = os.read(0, CHUNK)
            if not data:
                send_frame(sock, lock, STDIN_EOF)
                return
            send_frame(sock, lock, STDIN, data)
    except OSError:
        return  # the connection is gone: the main loop says so


def main() -> None:
    job_dir, host, command = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    try:
        hosts = json.loads((job_dir / "hora" / HOSTS_FILE).read_text())["hosts"]
        secret = bytes.fromhex((job_dir / "hora" / SECRET_FILE).read_text().strip())
    except (OSError, ValueError, KeyError) as exc:
        unreachable(f"host {host}: the job's Ray hosts are not placed ({job_dir / 'hora'}: {exc})")
    if host not in hosts:
        unreachable(f"host {host} is not one of the job's Ray hosts ({', '.join(sorted(hosts))})")
    entry = hosts[host]
    node = f"host {host} (Ray node {entry['address']}, node id {entry['node_id']})"
    try:
        sock = socket.create_connection((entry["address"], int(entry["port"])), timeout=CONNECT_SECONDS)
    except OSError as exc:
        unreachable(f"{node}: cannot reach its agent at {entry['address']}:{entry['port']} ({exc}); the node or its "
              "actor is gone, or a firewall drops the port")
    lock, done = threading.Lock(), threading.Event()
    try:
        client_handshake(sock, secret, Role.AGENT, 0, HANDSHAKE_SECONDS)
        sock.settimeout(None)
        keepalive(sock)
        send_frame(sock, lock, REQUEST, json.dumps({"command": command}).encode())
        threading.Thread(target=_forward_stdin, args=(sock, lock), daemon=True).start()
        threading.Thread(target=beat, args=(sock, lock, done), daemon=True).start()
        while True:
            if not wait_readable(sock, LOST_AFTER):
                unreachable(f"{node}: no word from its agent for {LOST_AFTER:g}s (the node is lost or cut off)")
            kind, data = recv_frame(sock, f"the agent of {node}")
            if kind == STDOUT:
                _write(1, data)
            elif kind == STDERR:
                _write(2, data)
            elif kind == EXIT:
                (code,) = struct.unpack("!i", data)
                break
            elif kind != PING:
                raise HoraError(f"a frame of unknown kind {kind}")
    except (HoraError, OSError, ValueError, struct.error) as exc:
        unreachable(f"{node}: lost the connection to its agent ({exc})")
    done.set()
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
