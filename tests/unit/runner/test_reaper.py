"""The reaper hora run leaves behind: if the launcher dies without saying ``done``, the ranks' process groups are
killed and the job's private stacks directory is removed; after ``done`` nothing is touched."""

from __future__ import annotations

import subprocess
import time

from hora.runner.reaper import GroupReaper


def _wait_gone(proc: subprocess.Popen[bytes]) -> int | None:
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.poll()


def test_a_launcher_that_dies_unannounced_takes_its_groups_and_stacks_directory_with_it(tmp_path):
    stacks = tmp_path / "hora-stacks-job"
    stacks.mkdir()
    (stacks / "123.stacks").write_text("")
    rank = subprocess.Popen(["sleep", "60"], start_new_session=True)
    reaper = GroupReaper()
    reaper.add(rank.pid)
    reaper.remove_on_death(str(stacks))
    assert reaper._proc is not None and reaper._proc.stdin is not None
    reaper._proc.stdin.close()  # what the kernel does when the launcher dies: the pipe ends without "done"
    assert _wait_gone(rank) == -9
    assert reaper._proc.wait(10) == 0 and not stacks.exists()


def test_after_done_the_reaper_leaves_everything_alone(tmp_path):
    stacks = tmp_path / "kept"
    stacks.mkdir()
    rank = subprocess.Popen(["sleep", "60"], start_new_session=True)
    reaper = GroupReaper()
    reaper.add(rank.pid)
    reaper.remove_on_death(str(stacks))
    reaper.close()
    try:
        assert rank.poll() is None and stacks.exists()
    finally:
        rank.kill()
        rank.wait()
