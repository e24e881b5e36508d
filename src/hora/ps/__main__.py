"""A parameter-server process: ``python -m hora.ps --index I --workers N`` (``hora run --num-ps`` starts these).

It reads the job's secret and rendezvous store from the environment like a rank, serves on its bind address,
publishes that address at the store, and runs until SIGTERM/SIGINT (the launcher stops it when the workers are
done) or until its parent, the launcher, dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from hora.config import Config
from hora.errors import HoraError
from hora.ps.autosave import ShardSaver, restore_server
from hora.ps.directory import open_store, publish
from hora.ps.server import ParameterServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hora.ps", description="one parameter server of a hora job")
    parser.add_argument("--index", type=int, required=True, help="this server's index (0..S-1)")
    parser.add_argument("--workers", type=int, required=True, help="number of workers (ranks) of the job")
    parser.add_argument("--generation", type=int, default=0, help="restarts so far (> 0: restore the checkpoint)")
    args = parser.parse_args(argv)
    config = Config.resolve()
    logging.getLogger("hora").setLevel(config.log_level)
    logging.basicConfig(format=f"[ps{args.index}] %(levelname)s %(message)s")
    stopping = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)
        server.shutdown(timeout=0)

    try:
        store, secret = open_store(config, -1 - args.index)
        host = config.bind_addr or "127.0.0.1"
        server = ParameterServer(secret, args.index, args.workers, host=host, op_timeout=config.op_timeout)
        if config.ps_checkpoint_dir:
            server.saver = ShardSaver(config.ps_checkpoint_dir, args.index, config.ps_checkpoint_steps, server._layouts)
            if args.generation == 0:  # a new job: what an earlier job left in DIR/ps<i> must never be restored
                server.saver.forget()
            else:
                restored = restore_server(server, server.saver)
                print(f"parameter server {args.index}: restart {args.generation}, restored {restored} shard(s) "
                      f"from {server.saver.dir}", file=sys.stderr, flush=True)  # fmt: skip
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        _, port = server.start()
        publish(store, args.index, host, port, os.getpid(), args.generation)
        store.close()
    except (HoraError, OSError, ValueError, KeyError) as exc:
        print(f"parameter server {args.index}: {exc}", file=sys.stderr)
        return 1
    while not server.wait(1.0):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
