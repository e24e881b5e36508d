"""`hora run` as a user sees it: prefixed output, files, exit codes, signals, no orphans."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hora.runner.system_metrics import METRIC_NAMES
from support import paths
from support.procs import child_states

SCRIPTS = paths.SCRIPTS


def hora_run(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hora", "run", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def alive(pid: int) -> bool:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def test_output_is_prefixed_by_rank_and_stream():
    code = "import os, sys; r = os.environ['HORA_RANK']; print('out', r); print('err', r, file=sys.stderr)"
    proc = hora_run("-np", "2", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    for r in (0, 1):
        assert f"[{r}]<stdout>: out {r}" in proc.stdout.splitlines()
        assert f"[{r}]<stderr>: err {r}" in proc.stderr.splitlines()


def test_output_filename_writes_per_rank_files(tmp_path):
    code = "import os, sys; print('hello from', os.environ['HORA_RANK']); print('oops', file=sys.stderr)"
    (tmp_path / "system.jsonl").write_text('{"earlier": "run"}\n')
    proc = hora_run("-np", "3", "--output-filename", str(tmp_path / "logs"), "--system-metrics", "system.jsonl",
                    sys.executable, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for r in range(3):
        assert (tmp_path / "logs" / f"rank.{r}" / "stdout").read_text() == f"hello from {r}\n"
        assert (tmp_path / "logs" / f"rank.{r}" / "stderr").read_text() == "oops\n"
    # --system-metrics: this host's samples appended (relative to where hora run started), the last at its end
    lines = [json.loads(line) for line in (tmp_path / "system.jsonl").read_text().splitlines()]
    assert lines[0] == {"earlier": "run"}
    assert [s["name"] for s in lines[1:]] == list(METRIC_NAMES) * ((len(lines) - 1) // len(METRIC_NAMES))
    assert len(lines) > 1 and all(set(s) == {"time", "host", "name", "value"} for s in lines[1:])
    assert {s["host"] for s in lines[1:]} == {socket.gethostname()}
    bad = hora_run("-np", "1", "--system-metrics", str(tmp_path / "no" / "such" / "dir" / "m.jsonl"), "true")
    assert bad.returncode != 0 and "--system-metrics" in bad.stderr and "cannot be opened" in bad.stderr


def test_merge_stderr_to_stdout_keeps_the_order_of_everything_a_rank_writes():
    # Interleaved writes to two pipes can swap; with one pipe (mpirun's flag) the order is the order written.
    code = "import sys\nfor i in range(300): print(i, file=(sys.stdout, sys.stderr)[i % 2], flush=True)"
    proc = hora_run("-np", "1", "--merge-stderr-to-stdout", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"[0]<stdout>: {i}" for i in range(300)]
    assert "[0]<stderr>" not in proc.stderr


def _is_rank(pid: int) -> bool:
    """Whether ``pid`` runs the rank's program (the launcher also has a /bin/sh helper that ends the ranks' groups
    should it be killed)."""
    try:
        return b"HORA_RANK" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_ranks_that_end_early_are_reaped_while_the_others_run():
    """Issue 27, item 4: exited ranks must not pile up as zombies while the job goes on."""
    code = "import os, time; time.sleep(5 if os.environ['HORA_RANK'] == '0' else 0)"
    proc = subprocess.Popen([sys.executable, "-m", "hora", "run", "-np", "6", sys.executable, "-c", code],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30  # a bound against hanging
        children: dict[int, bytes] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            children = child_states(proc.pid)
            ranks = [pid for pid, state in children.items() if state != b"Z" and _is_rank(pid)]
            if len(ranks) == 1:  # ranks 1-5 ended, rank 0 sleeps on: give the launcher a moment, then look again
                time.sleep(1.0)
                children = child_states(proc.pid)
                break
        assert proc.poll() is None, "the job ended before the check"
        assert [pid for pid, state in children.items() if state == b"Z"] == [], children
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_exit_code_is_the_first_failing_ranks_and_the_report_names_it():
    code = ("import os, sys, time\nr = int(os.environ['HORA_RANK'])\n"
            "if r == 2: print('disk full', file=sys.stderr); sys.exit(5)\ntime.sleep(60)")
    start = time.monotonic()
    proc = hora_run("-np", "3", sys.executable, "-c", code)
    assert proc.returncode == 5
    assert time.monotonic() - start < 30
    report = proc.stderr[proc.stderr.index("hora run: rank 2 failed first"):]
    assert "exit  : exit code 5" in report and "disk full" in report
    assert "stopped by hora run" in report


def test_settings_flags_reach_the_workers():
    code = "import os; print(os.environ['HORA_START_TIMEOUT'], os.environ['HORA_TRANSPORT'], os.environ['HORA_LOG_LEVEL'])"
    proc = hora_run("-np", "1", "--start-timeout", "7", "--transport", "tcp", "--log-level", "debug", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "[0]<stdout>: 7.0 tcp DEBUG" in proc.stdout


def test_verbose_reports_what_the_launcher_does():
    proc = hora_run("-np", "2", "--verbose", "true")
    assert proc.returncode == 0
    assert "hora run: started rank 0 as pid" in proc.stderr and "hora run: rank 1 (pid" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-np", "3", "-H", "localhost:2", "true"], "-np 3 is more than the 2 slots given by -H"),
        (["-np", "2", "-H", "node-that-is-not-here.invalid:2", "true"], "host node-that-is-not-here.invalid: "),
        (["-np", "0", "true"], "-np must be at least 1"),
        (["-H", "localhost:x", "true"], "is not host:slots"),
    ],
)
def test_bad_arguments_are_clear_errors(args, message):
    proc = hora_run(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_hosts_give_the_default_np():
    proc = hora_run("-H", "localhost:3", sys.executable, "-c", "import os; print(os.environ['HORA_SIZE'])")
    assert proc.returncode == 0 and proc.stdout.count("3") == 3


def test_missing_program_is_reported():
    proc = hora_run("-np", "1", "/no/such/program")
    assert proc.returncode == 127 and "cannot start '/no/such/program'" in proc.stderr


def _start_lingering(tmp_path: Path, np_: int, mode: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    launcher = subprocess.Popen([sys.executable, "-m", "hora", "run", "-np", str(np_), "--grace-period", "2", sys.executable,
                                 str(SCRIPTS / "linger.py"), str(tmp_path), mode],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"pids.{r}").exists() for r in range(np_)):
        assert time.monotonic() < deadline, "the ranks never started"
        assert launcher.poll() is None, "the launcher exited early"
        time.sleep(0.05)
    time.sleep(0.5)  # let the ranks reach init/collective
    pids = [int(p) for r in range(np_) for p in (tmp_path / f"pids.{r}").read_text().split()]
    return launcher, pids


@pytest.mark.parametrize(("sig", "mode"), [(signal.SIGINT, "collective"), (signal.SIGTERM, "sleep"),
                                           (signal.SIGINT, "stubborn")])
def test_signals_reach_every_worker_and_leave_no_orphans(tmp_path, sig, mode):
    launcher, pids = _start_lingering(tmp_path, 3, mode)
    try:
        launcher.send_signal(sig)
        assert launcher.wait(timeout=30) == 128 + sig
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [p for p in pids if alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"processes outlived hora run: {survivors}"


def _sigterm_once(launcher: subprocess.Popen, ready, poll: float = 0.05) -> None:
    """SIGTERM to ``launcher`` once ``ready()`` (within 60 s); it must exit with 128+SIGTERM within 30 s."""
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert time.monotonic() < deadline and launcher.poll() is None, "the ranks never started"
            time.sleep(poll)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _children(pid: int) -> list[int]:
    return list(child_states(pid))


def test_sigterm_while_the_ranks_start_stops_them_all_at_once():
    """SIGTERM as soon as the first of 150 ranks exists (the launcher is still starting the others): no rank is
    started after it, and every one started is stopped now, not after the 60 s grace period."""
    marker = f"hora-start-signal-{os.getpid()}"
    launcher = subprocess.Popen([sys.executable, "-m", "hora", "run", "-np", "150", "--oversubscribe",
                                 "--grace-period", "60", "sh", "-c", f"exec sleep 600 # {marker}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _sigterm_once(launcher, lambda: bool(_children(launcher.pid)), poll=0.001)
    left = [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and marker.encode() in _cmdline(int(e.name))]  # fmt: skip
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_workers_die_with_a_killed_launcher(tmp_path):
    launcher, pids = _start_lingering(tmp_path, 2, "sleep")
    workers = pids[0::2]
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in pids:  # the grandchildren (sleep) have no death signal: clean them up ourselves
        if alive(p):
            os.kill(p, signal.SIGKILL)
    assert not any(alive(p) for p in workers)


def test_launcher_sweeps_shared_memory_a_crashed_rank_left_behind():
    # A rank that dies between creating its job's segment and sharing it leaves a named segment; stand in for it.
    code = ("import os; from hora._transport.shm import job_prefix, segment_path\n"
            "open(segment_path(job_prefix(os.environ['HORA_JOB_ID']) + '0-1'), 'wb').close()\n"
            "os.kill(os.getpid(), 9)")
    proc = hora_run("-np", "1", "--verbose", sys.executable, "-c", code)
    assert proc.returncode == 137
    assert "removed shared memory hora-" in proc.stderr
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("hora-")]


def test_output_without_newlines_is_forwarded_whole_with_one_prefix():
    code = "import sys; sys.stdout.write('x' * 300_000); sys.stdout.flush()"
    proc = hora_run("-np", "1", sys.executable, "-c", code)
    assert proc.returncode == 0
    assert proc.stdout.count("[0]<stdout>: ") == 1
    assert "[0]<stdout>: " + "x" * 300_000 + "\n" in proc.stdout


def test_ranks_get_their_share_of_the_cores_as_thread_defaults():
    code = "import os; print(os.environ.get('OMP_NUM_THREADS'), os.environ.get('MKL_NUM_THREADS'))"
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    proc = hora_run("-np", "2", sys.executable, "-c", code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[0]<stdout>: {share} {share}", f"[1]<stdout>: {share} {share}"]
    proc = hora_run("-np", "2", sys.executable, "-c", code, env={**env, "OMP_NUM_THREADS": "7"})
    assert sorted(proc.stdout.splitlines()) == [f"[0]<stdout>: 7 {share}", f"[1]<stdout>: 7 {share}"]
    proc = hora_run("-np", "2", "--no-thread-defaults", sys.executable, "-c", code, env=env)
    assert sorted(proc.stdout.splitlines()) == ["[0]<stdout>: None None", "[1]<stdout>: None None"]


RANK_WITH_A_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
path = os.path.join(sys.argv[1], f"child-{os.environ['HORA_RANK']}")
with open(path + ".tmp", "w") as f:
    f.write(str(child.pid))
os.replace(path + ".tmp", path)
time.sleep(300)
"""


def test_sigkill_of_hora_run_also_ends_what_each_rank_started(tmp_path):
    """Issue 19, item 7: PDEATHSIG took the ranks along, but their own children lived on under PID 1."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_WITH_A_CHILD)
    launcher = subprocess.Popen([sys.executable, "-m", "hora", "run", "-np", "2", sys.executable, str(script),
                                 str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(children) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            children = [int(p.read_text()) for p in tmp_path.glob("child-*") if not p.name.endswith(".tmp")]
            time.sleep(0.05)
        assert len(children) == 2, "the ranks never started their children"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in children), "a rank's child outlived the killed launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return b") Z" not in f.read()
    except FileNotFoundError:
        return False


def test_sigterm_is_forwarded_and_the_grace_period_lets_a_script_checkpoint(tmp_path):
    # The script takes 4 s to checkpoint after SIGTERM: more than hora run's old fixed 3 s, within --grace-period 8.
    code = (
        "import signal, sys, time, pathlib\n"
        "def on_term(*_):\n"
        "    time.sleep(4); pathlib.Path(sys.argv[1], 'ckpt').write_text('saved'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "pathlib.Path(sys.argv[1], 'up').write_text('')\n"
        "time.sleep(60)\n"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hora", "run", "-np", "1", "--grace-period", "8", sys.executable, "-c", code,
         str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    _sigterm_once(launcher, (tmp_path / "up").exists)
    assert (tmp_path / "ckpt").read_text() == "saved"


def test_the_report_shows_where_a_stuck_rank_was_before_it_was_stopped(tmp_path):
    from hora.runner import run_command

    out = tmp_path / "out"
    result = run_command([sys.executable, str(SCRIPTS / "frozen_rank.py")], np=3, capture=True, timeout=60,
                         output_filename=str(out), op_timeout=2, grace_period=2)
    assert result.exit_code == 1
    assert "in think_hard" in result.stacks[1]  # its main thread, frozen where it stopped (SIGCONT came after)
    report = result.report()
    assert "where the ranks still running were (all threads:" in report
    assert f"rank 1: {SCRIPTS / 'frozen_rank.py'}:13 in think_hard" in report
    assert "in think_hard" in (out / "rank.1" / "stacks").read_text()


def test_a_rank_that_loses_its_peer_shows_its_own_frames_and_keeps_the_full_traceback():
    """Issue 27, item 2: the surviving rank's error shows the script's line and hora's reason, not the engine."""
    code = ("import os, numpy as np, hora.numpy as hvd\nhvd.init()\nif hvd.rank() == 1:\n    os._exit(3)\n"
            "hvd.allreduce(np.ones(2), name='x')\n")
    proc = hora_run("-np", "2", sys.executable, "-c", code)
    assert proc.returncode == 3
    said = [line.removeprefix("[0]<stderr>: ") for line in proc.stderr.splitlines() if line.startswith("[0]<stderr>")]
    assert said[:2] == ["Traceback (most recent call last):", '  File "<string>", line 5, in <module>'], said
    assert said[-1].startswith("hora.errors.PeerLostError: rank 1 (host "), said
    assert not any("/hora/_engine/" in line or "/hora/_frontend/" in line for line in said), said
    saved = Path(said[-2].split("the full traceback is in ")[1].rstrip("]"))
    try:
        assert "/hora/_frontend/" in saved.read_text() and "PeerLostError" in saved.read_text()
    finally:
        saved.unlink()


def test_a_daemon_a_rank_double_forks_is_ended_with_the_job_and_named():
    """Issue 27, item 6: a setsid daemon escaped the rank's process group and outlived the job under PID 1."""
    marker = f"hora-daemon-{os.getpid()}"
    code = f"import subprocess; subprocess.Popen(['setsid', 'sh', '-c', 'exec sleep 600 # {marker}'])"
    proc = hora_run("-np", "1", sys.executable, "-c", code)
    left = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and marker.encode() in _cmdline(int(e.name))]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert proc.returncode == 0 and left == []
    assert "hora run: ended 1 process(es) the ranks left running: " in proc.stderr and "(sleep 600" in proc.stderr
