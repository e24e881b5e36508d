"""``python -m hora`` and the ``hora`` command: :func:`hora.cli.main`, imported here so that a Ctrl-C at any moment,
the imports included, ends the command with one line and exit code 130 instead of a traceback."""

from __future__ import annotations

import signal
import sys


def run() -> int:
    try:
        from hora.cli import main

        return main()
    except KeyboardInterrupt:
        print("hora: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(run())
