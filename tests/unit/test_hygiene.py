"""The hygiene fixture (tests/conftest.py) fails a test that leaves a thread running, changes the environment or
leaves a child process behind, and passes one that cleans up after itself."""

from __future__ import annotations

import pytest

from support import paths

pytest_plugins = ["pytester"]

LEAKY = '''
import os, subprocess, sys, threading, time

def test_leaves_a_thread():
    threading.Thread(target=time.sleep, args=(30,), name="leaked-sleeper", daemon=True).start()

def test_changes_the_environment():
    os.environ["HORA_HYGIENE_PROBE"] = "1"

def test_leaves_a_child():
    from hora._proc import die_with_parent  # it dies with this pytest process, not after it
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=die_with_parent)

def test_cleans_up(monkeypatch):
    monkeypatch.setenv("HORA_HYGIENE_PROBE", "2")
    t = threading.Thread(target=time.sleep, args=(0.1,))
    t.start()
    t.join()
'''


def test_hygiene_fails_leaks_and_passes_clean_tests(pytester: pytest.Pytester, monkeypatch) -> None:
    pytester.makeconftest((paths.TESTS / "conftest.py").read_text())
    monkeypatch.setenv("PYTHONPATH", str(paths.TESTS))  # the conftest imports the helpers beside it (support.*)
    pytester.makepyfile(test_leaks=LEAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4, errors=3)
    out = result.stdout.str()
    assert "the test left threads running: ['leaked-sleeper']" in out
    assert "the test changed the environment (use monkeypatch): ['HORA_HYGIENE_PROBE']" in out
    assert "the test left child processes behind" in out
