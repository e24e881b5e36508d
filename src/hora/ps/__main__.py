"""A parameter-server process: ``python -m hora.ps --index I --workers N`` (``hora run --num-ps`` starts these).

It reads the job's secret and rendezvous store from the environment like a rank, serves on its bind address
(``HORA_BIND_ADDR``; else, like a rank, 127.0.0.1 when the store is on a loopback address and otherwise the address
this host reaches the store from, so workers on other hosts reach it) and a port of ``HORA_PORT_RANGE`` if set,
publishes that address and its host's name (``HORA_HOSTNAME``: workers of the same host use shared memory) at the
store, and runs until SIGTERM/SIGINT (the launcher stops it when the workers are done) or until its parent (the
launcher, or a remote host's agent) dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import socket
import sys

from hora._runtime.bootstrap import local_addr_towards
from hora.config import Config
from hora.errors import ConfigError, HoraError
from hora.ps.autosave import ShardSaver, restore_server
from hora.ps.directory import open_store, publish
from hora.ps.server import ParameterServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hora.ps", description="one parameter server of a hora job"
    )
    parser.add_argument("--index", type=int, required=True, help="this server's index (0..S-1)")
    parser.add_argument("--workers", type=int, required=True, help="number of workers (ranks) of the job")
    parser.add_argument(
        "--generation", type=int, default=0, help="restarts so far (> 0: restore the checkpoint)"
    )
    args = parser.parse_args(argv)
    config = Config.resolve()
    logging.getLogger("hora").setLevel(config.log_level)
    logging.basicConfig(format=f"[ps{args.index}] %(levelname)s %(message)s")
    stopping = []

    def stop(signum: int, frame: object) -> None:
        # only noted here: shutting down inside the handler could take a lock the interrupted main thread holds
        # (its wait below), and the server would never stop
        stopping.append(signum)

    try:
        store, secret = open_store(config, -1 - args.index)
        host = config.bind_addr or _address_towards(config.rendezvous_addr)
        server = _server(secret, args.index, args.workers, host, config)
        if config.ps_checkpoint_dir:
            server.saver = ShardSaver(
                config.ps_checkpoint_dir, args.index, config.ps_checkpoint_steps, server._layouts
            )
            # a new job: what an earlier job left in DIR/ps<i> must never be restored. A restart whose earlier
            # generations never served (killed before they published their address) has nothing to restore either:
            # no worker could have registered a variable, and the first may have died before writing its manifest.
            if args.generation == 0 or store.get(str(args.index)) is None:
                server.saver.forget()
            else:
                restored = restore_server(server, server.saver)
                print(
                    f"parameter server {args.index}: restart {args.generation}, restored {restored} shard(s) "
                    f"from {server.saver.dir}",
                    file=sys.stderr,
                    flush=True,
                )
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        _, port = server.start()
        hostname = config.hostname or socket.gethostname()
        publish(store, args.index, host, port, os.getpid(), hostname, args.generation)
        store.close()
        logging.getLogger("hora.ps").info(
            "serving at %s:%d on host %s for %d workers", host, port, hostname, args.workers
        )
    except (HoraError, OSError, ValueError, KeyError) as exc:
        print(f"parameter server {args.index}: {exc}", file=sys.stderr)
        return 1
    while not server.wait(0.1):
        if stopping:
            server.shutdown(timeout=0)
    return 0


def _server(secret: bytes, index: int, workers: int, host: str, config: Config) -> ParameterServer:
    """A server on any free port, or on the first free one of ``HORA_PORT_RANGE`` (tried from a random start, as
    the ranks' listeners, so a host's servers and ranks do not all race for the same port)."""
    if not config.port_range:
        return ParameterServer(secret, index, workers, host=host, op_timeout=config.op_timeout)
    low, high = (int(x) for x in config.port_range.split("-"))
    ports = list(range(low, high + 1))
    start = random.randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        try:
            return ParameterServer(secret, index, workers, host=host, port=port, op_timeout=config.op_timeout)
        except OSError:
            continue
    raise ConfigError(
        f"parameter server {index}: no free port on {host} in HORA_PORT_RANGE={config.port_range}; every rank and "
        "every parameter server of a host needs one: widen the range"
    )


def _address_towards(store: str) -> str:
    if not store or store.startswith("127.") or store in ("localhost", "::1"):
        return "127.0.0.1"
    return local_addr_towards(store)


if __name__ == "__main__":
    sys.exit(main())
