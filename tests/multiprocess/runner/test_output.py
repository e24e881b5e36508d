"""Under hora run, a rank's partial line (a progress bar) reaches the terminal while the rank still runs."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

SCRIPT = """
import os, sys, time
sys.stderr.write("progress 50%")
sys.stderr.flush()
while not os.path.exists(sys.argv[1]):  # the test lets it finish only once it has seen the partial line
    time.sleep(0.05)
sys.stderr.write("\\rprogress 100%\\n")
"""


def test_a_partial_line_arrives_before_the_rank_ends(tmp_path):
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hora", "run", "-np", "1", sys.executable, "-c", SCRIPT, str(go)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    try:
        seen = b""
        deadline = time.monotonic() + 60  # a bound against hanging, not a speed limit
        while b"progress 50%" not in seen:
            assert time.monotonic() < deadline, f"the partial line never arrived while the rank ran: {seen!r}"
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stderr.fileno(), 4096)
                assert chunk, f"hora run ended before showing the partial line: {seen!r}"
                seen += chunk
        assert proc.poll() is None  # the rank is still waiting for us
        go.touch()
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert (seen + rest).decode().startswith("[0]<stderr>: progress 50%\r[0]<stderr>: progress 100%\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
