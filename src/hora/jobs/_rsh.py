"""How the master host reaches the others: ``python -m hora.jobs._rsh JOB_DIR HOST COMMAND``, used by hora run in
place of ``ssh HOST COMMAND`` (``SshOptions.agent``).

It connects to the host's agent (:mod:`hora.jobs._host`) on its Unix socket — retrying while the host is still
starting, up to the connect time-out — authenticates with the attempt's secret, hands over the shell command with
its own stdin, stdout and stderr, and exits with the command's exit status (255, like ssh, when the host cannot be
reached). Killing it ends the command on the host, as closing an SSH session does.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from hora._runtime.auth import Role, client_handshake
from hora._wire import recv_frame
from hora.config.variables import read
from hora.errors import HoraError
from hora.jobs._host import HANDSHAKE_SECONDS
from hora.jobs.cluster import read_secret, socket_path
from hora.jobs.plan import JobPlan
from hora.jobs.records import unreachable


def main() -> None:
    job_dir, host, command = sys.argv[1], sys.argv[2], sys.argv[3]
    timeout = float(read("HORA_JOB_CONNECT_TIMEOUT") or JobPlan.read(job_dir).connect_timeout)
    path = socket_path(job_dir, host)
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            break
        except OSError as exc:
            sock.close()
            if time.monotonic() > deadline:
                unreachable(f"host {host} did not come up within {timeout:g}s: its agent does not listen at {path} "
                      f"({exc.strerror}); see that host's messages in the job's log")
            time.sleep(0.1)
    try:
        client_handshake(sock, read_secret(job_dir), Role.AGENT, 0, HANDSHAKE_SECONDS)
        body = json.dumps({"command": command}).encode()
        socket.send_fds(sock, [len(body).to_bytes(8, "big") + body], [0, 1, 2])
        reply = json.loads(recv_frame(sock, 1 << 16, f"host {host}'s agent"))
    except (HoraError, OSError, ValueError) as exc:
        unreachable(f"lost host {host}'s agent: {exc}")
    code = int(reply["exit"])
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
