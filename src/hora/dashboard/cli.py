"""``hora dashboard [--home DIR] [--host ADDRESS] [--port P]``: start the dashboard's web server and say where it is."""

from __future__ import annotations

import argparse
import secrets
import socket
import sys

from hora.config.variables import read
from hora.dashboard import missing_extra
from hora.dashboard.access import needs_token
from hora.jobs.store import JobStore

__all__ = ["add_dashboard_parser", "dashboard_main"]

DEFAULT_PORT = 8585
#: Seconds open event streams get to end when the server stops (they are cut after it).
SHUTDOWN_GRACE = 2


def add_dashboard_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard",
        help="watch jobs in a web browser",
        description="Serve a web page of the jobs in the jobs home: their status, live logs, metric and system "
        "charts, artifacts. It listens on 127.0.0.1 (this machine only) unless --host says otherwise; on any other "
        "address every request needs a token ($HORA_DASHBOARD_TOKEN, or a random one printed at start).",
    )
    p.add_argument("--home", default=None, help="the jobs home (default ~/.hora, or $HORA_JOB_HOME)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port (default {DEFAULT_PORT}; 0: a free one)")


def dashboard_main(args: argparse.Namespace) -> int:
    problem = missing_extra()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import uvicorn

    from hora.dashboard.app import create_app

    store = JobStore(args.home)
    given = read("HORA_DASHBOARD_TOKEN") or None
    token = given if given is not None or not needs_token(args.host) else secrets.token_urlsafe(24)
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"hora dashboard: cannot listen on {args.host}:{args.port}: {exc.strerror or exc} (is another "
              "dashboard running there? --port 0 picks a free port)", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):  # every address: name the machine
        host = socket.gethostname()
    where = f"[{host}]" if ":" in host else host
    address = f"http://{where}:{port}/"
    if token is not None and given is None:
        address += f"?token={token}"
    note = "; the token is $HORA_DASHBOARD_TOKEN" if given else ""
    print(f"hora dashboard: {address}  (jobs in {store.home}{note}; Ctrl-C stops it)", flush=True)
    config = uvicorn.Config(
        create_app(store.home, token), log_level="warning", lifespan="off", timeout_graceful_shutdown=SHUTDOWN_GRACE
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
