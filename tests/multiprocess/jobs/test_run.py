"""Real jobs end to end: outcomes, failure reasons, limits, retries, stop signals, artifacts, CLI output."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from hora.cli import main
from hora.jobs import JobStore, load_spec, parse_spec, start_job, stop_job, wait_job
from hora.jobs.states import JobStatus, SecondaryStatus
from hora.runner.system_metrics import METRIC_NAMES
from support import paths

REPO = paths.REPO
EXAMPLE = REPO / "examples" / "jobs" / "job.yaml"


def run_script(tmp_path: Path, script: str, name: str, **fields) -> tuple[JobStore, object]:
    src = tmp_path / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "train.py").write_text(textwrap.dedent(script))
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": name, **fields})
    store = JobStore(tmp_path / "home")
    return store, start_job(spec, store, wait=True, echo=False)


def _running(stat: Path) -> bool:
    try:
        return b") Z" not in stat.read_bytes()
    except FileNotFoundError:
        return False


def members(path: str) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_example_trains_on_two_hosts_and_records_metrics(tmp_path, capsys):
    store = JobStore(tmp_path / "home")
    spec = load_spec(EXAMPLE, {"job_name": "example", "profiler_config": {"system_monitor_interval_millis": 100}})
    record = start_job(spec, store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    assert record.secondary_status == "Completed" and record.exit_code == 0 and record.attempts == 1
    model = members(record.artifacts["model"])
    assert set(model) == {"weights.npy"}
    summary = json.loads(members(record.artifacts["output"])["summary.json"])
    assert summary["hosts"] == ["algo-1", "algo-2"] and summary["ranks"] == 4
    assert summary["final_accuracy"] > 0.9
    metrics = store.metrics("example")
    losses = [m for m in metrics if m[0] == "train:loss"]
    assert len(losses) == 8 and all(m[3:6] == ("algo-1", 0, 1) for m in losses)
    assert losses[-1][1] < losses[0][1]
    # hora job metrics / describe / logs
    assert main(["job", "--home", str(store.home), "metrics", "example"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["TIME", "METRIC", "VALUE", "HOST", "RANK", "ATTEMPT"]
    assert re.search(r"train:accuracy\s+0\.9\d*\s+algo-1\s+0\s+1", out)
    assert main(["job", "--home", str(store.home), "describe", "example"]) == 0
    out = capsys.readouterr().out
    assert "Status:            Completed" in out and "Hosts:             2 x 2 process(es), distribution mpi" in out
    assert f"Artifact model: {record.artifacts['model']}" in out and "Final metrics:     train:accuracy=" in out
    assert re.search(r"^Network: +(namespace|loopback) \(algo-1=[\d.]+, algo-2=[\d.]+; interface (eth0|lo)\)$", out, re.M)
    assert [line.split()[3] for line in out.split("Status history:\n")[1].splitlines()] == [
        "Starting", "Starting", "Downloading", "Training", "Uploading", "Completed"]
    ranks = out.split("Ranks (attempt 1):\n")[1].split("Final metrics")[0].splitlines()
    assert [line.split()[:2] + line.split()[3:] for line in ranks[1:]] == [
        ["0", "algo-1", "exit", "code", "0"], ["1", "algo-1", "exit", "code", "0"],
        ["2", "algo-2", "exit", "code", "0"], ["3", "algo-2", "exit", "code", "0"]]
    assert main(["job", "--home", str(store.home), "logs", "example", "--host", "algo-1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if "epoch " in line]) == 8
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[algo-1 rank 0\]<stdout> epoch 1: train_loss=", lines[0])
    assert main(["job", "--home", str(store.home), "list"]) == 0
    assert re.search(r"^example\s+Completed\s+Completed\s.*\s2x2$", capsys.readouterr().out, re.M)
    # system metrics: each host sampled itself (its own network namespace) into the store, the last at its end
    system = list(store.iter_system_metrics("example"))
    for host in ("algo-1", "algo-2"):
        names = [name for h, _, name, _ in system if h == host]
        assert set(names) == set(METRIC_NAMES) and len(names) >= 2 * len(METRIC_NAMES), (host, names)
    assert [t for _, t, _, _ in system] == sorted(t for _, t, _, _ in system)
    assert all(0 <= v <= 100 for _, _, n, v in system if n.endswith("percent"))
    # the ranks talked across hosts: the master's namespace carried traffic
    assert any(v > 0 for h, _, n, v in system if h == "algo-1" and n == "network_transmit_bytes_per_second")
    assert main(["job", "--home", str(store.home), "metrics", "example", "--system"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["TIME", "HOST", "METRIC", "VALUE"]
    assert re.search(r"\salgo-2\s+cpu_percent\s+[\d.e+-]+$", out, re.M)


def test_plot_metrics(tmp_path):
    pytest.importorskip("matplotlib")
    store = JobStore(tmp_path / "home")
    start_job(load_spec(EXAMPLE, {"job_name": "plotted"}), store, wait=True, echo=False)
    assert main(["job", "--home", str(store.home), "metrics", "plotted", "--plot", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["job", "--home", str(store.home), "metrics", "plotted", "--system", "--plot",
                 str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


FAILING = """
    import os, numpy as np
    import hora.numpy as hvd

    hvd.init()
    open(os.path.join(os.environ["SM_MODEL_DIR"], f"partial-{hvd.rank()}.txt"), "w").write("before the failure")
    def load_batch(i):
        raise ValueError(f"batch {i} is corrupt")
    if hvd.rank() == 3:
        load_batch(7)
    hvd.allreduce(np.ones(3), name="never")
"""


def test_failing_rank_names_host_rank_exit_code_and_traceback(tmp_path):
    _, record = run_script(tmp_path, FAILING, "failing", instance_count=2, processes_per_host=2,
                               distribution="mpi")
    assert (record.status, record.secondary_status, record.exit_code) == ("Failed", "Failed", 1)
    reason = record.failure_reason
    assert reason.startswith("AlgorithmError: host algo-2, rank 3 (pid "), reason
    assert "failed first: exit code 1" in reason.splitlines()[0]
    assert "Traceback (most recent call last):" in reason
    assert "load_batch(7)" in reason and reason.rstrip().endswith("ValueError: batch 7 is corrupt")
    # artifacts even after a failure: every host's model/ in one archive
    assert set(members(record.artifacts["model"])) == {f"partial-{r}.txt" for r in range(4)}
    assert Path(record.artifacts["output"]).is_file()


STALLING = """
    import time
    import numpy as np
    import hora.numpy as hvd
    hvd.init()
    if hvd.rank() == 3:
        time.sleep(600)  # stuck: the others wait for it in their allreduce
    hvd.allreduce(np.ones(4), name="grad")
"""


def test_the_rank_the_others_waited_for_is_named_not_a_waiting_one(tmp_path):
    _, record = run_script(tmp_path, STALLING, "stalling", instance_count=2, processes_per_host=2,
                           distribution={"mpi": {"enabled": True, "custom_mpi_options":
                               "--stall-check-warning-time-seconds 1 --stall-check-shutdown-time-seconds 3"}})  # fmt: skip
    assert record.status == "Failed"
    first = record.failure_reason.splitlines()[0]
    assert first.startswith("AlgorithmError: host algo-2, rank 3 (pid "), record.failure_reason
    assert "kept the other ranks waiting until the stall shutdown" in first, record.failure_reason


def test_script_written_failure_file_wins(tmp_path):
    script = """
        import os, sys
        if os.environ["SM_CURRENT_HOST"] == "algo-2":
            open(os.path.join(os.environ["SM_OUTPUT_DIR"], "failure"), "w").write("dataset shard 2 has no labels")
            sys.exit(5)
    """
    _, record = run_script(tmp_path, script, "failure-file", instance_count=2)
    assert record.status == "Failed" and record.exit_code == 5
    assert record.failure_reason == "AlgorithmError: algo-2 wrote output/failure:\ndataset shard 2 has no labels"


def test_signal_death_is_reported_as_such(tmp_path):
    _, record = run_script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "segv")
    assert record.status == "Failed" and record.exit_code == 139
    assert "host algo-1, rank 0" in record.failure_reason
    assert "killed by SIGSEGV (exit code 139)" in record.failure_reason


STUBBORN = """
    import os, signal, time
    rank = int(os.environ["HORA_RANK"])
    def on_term(signum, frame):
        open(os.path.join(os.environ["SM_MODEL_DIR"], f"sigterm-{rank}.txt"), "w").write(str(signum))
        if rank == 0:
            raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_term)   # rank 1 ignores the request: SIGKILL after the grace period
    open(os.path.join(os.environ["SM_MODEL_DIR"], "..", "checkpoints", f"started-{rank}"), "w").close()
    while True:
        time.sleep(0.05)
"""


def test_max_run_stops_with_sigterm_then_sigkill(tmp_path, capsys):
    store, record = run_script(tmp_path, STUBBORN, "too-long", processes_per_host=2, max_run=3, stop_grace=2)
    assert (record.status, record.secondary_status) == ("Stopped", "MaxRuntimeExceeded")
    assert record.failure_reason.startswith("MaxRuntimeExceeded: the job ran longer than max_run=3s")
    # both ranks got SIGTERM; rank 0 exited on it, rank 1 was killed after the grace period
    assert members(record.artifacts["model"]) == {"sigterm-0.txt": b"15", "sigterm-1.txt": b"15"}
    ranks = store.job_dir("too-long") / "hora" / "attempt-1"
    assert json.loads((ranks / "rank-0.json").read_text())["returncode"] == 0
    assert json.loads((ranks / "result.json").read_text())["returncodes"] == [0, -9]
    assert [t[2] for t in store.transitions("too-long")][-3:] == ["Stopping", "Uploading", "MaxRuntimeExceeded"]
    assert main(["job", "--home", str(store.home), "describe", "too-long"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ +0 +algo-1 +\d+ +exit code 0$", out, re.M)
    assert re.search(r"^ +1 +algo-1 +killed by SIGKILL$", out, re.M), out


def test_stop_reaches_the_script_of_a_detached_job(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(STUBBORN).replace("if rank == 0:", "if True:"))
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": "detached",
                       "instance_count": 2, "stop_grace": 20})
    monkeypatch.chdir(tmp_path)
    store = JobStore("home")  # relative: the detached supervisor runs elsewhere (it failed every such job)
    start_job(spec, store, wait=False)
    started = [store.job_dir("detached") / "hosts" / h / "checkpoints" / f"started-{r}"
               for h, r in (("algo-1", 0), ("algo-2", 1))]
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in started):
        assert time.monotonic() < deadline, store.get("detached")
        assert not store.get("detached").done, store.get("detached").failure_reason
        time.sleep(0.1)
    stop_job(store, "detached")
    record = wait_job(store, "detached", timeout=120)
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    assert record.failure_reason == "stopped by request (hora job stop)"
    assert members(record.artifacts["model"]) == {"sigterm-0.txt": b"15", "sigterm-1.txt": b"15"}
    assert main(["job", "--home", str(store.home), "stop", "detached"]) == 0


def test_retries_keep_checkpoints_and_start_fresh(tmp_path):
    script = """
        import os, sys
        ckpt = os.path.join(os.environ["SM_MODEL_DIR"], "..", "checkpoints", "attempts")
        n = int(open(ckpt).read()) + 1 if os.path.exists(ckpt) else 1
        open(ckpt, "w").write(str(n))
        leftovers = sorted(os.listdir(os.environ["SM_MODEL_DIR"]))
        open(os.path.join(os.environ["SM_MODEL_DIR"], f"attempt-{n}"), "w").write(",".join(leftovers))
        if n < 3:
            print(f"failing on attempt {n}", file=sys.stderr)
            sys.exit(2)
        print(f"resumed from checkpoint at attempt {n}")
    """
    store, record = run_script(tmp_path, script, "retried", max_retry_attempts=2)
    assert record.status == "Completed" and record.attempts == 3, record.failure_reason
    assert members(record.artifacts["model"]) == {"attempt-3": b""}  # model/ starts empty on each attempt
    messages = [t[3] for t in store.transitions("retried")]
    assert "attempt 3 of 3: 1 rank(s) with hora run" in messages
    _, record = run_script(tmp_path / "b", script.replace("n < 3", "n < 9"), "gave-up", max_retry_attempts=1)
    assert record.status == "Failed" and record.attempts == 2 and record.exit_code == 2
    assert "failing on attempt 2" in record.failure_reason


def test_shell_entry_point_and_package_with_requirements(tmp_path):
    src = tmp_path / "pkg"
    (src / "trainer").mkdir(parents=True)
    (src / "trainer" / "__init__.py").write_text("")
    (src / "trainer" / "main.py").write_text(textwrap.dedent("""
        import sys
        import helperlib
        print("helper says", helperlib.VALUE, "args", sys.argv[1:])
    """))
    (src / "setup.py").write_text("from setuptools import setup\nsetup(name='trainer', version='1.0', packages=['trainer'])\n")
    helper = tmp_path / "helper"
    helper.mkdir()
    (helper / "helperlib.py").write_text("VALUE = 42\n")
    (helper / "setup.py").write_text("from setuptools import setup\nsetup(name='helperlib', version='1.0', py_modules=['helperlib'])\n")
    (src / "requirements.txt").write_text(f"{helper}\nnumpy\n")  # numpy is here already: not installed again
    spec = parse_spec({"entry_point": "trainer/main.py", "source_dir": str(src), "job_name": "package",
                       "hyperparameters": {"x": 1},
                       "environment": {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
                                       "PIP_CONSTRAINT": str(REPO / "constraints.txt")}})
    store = JobStore(tmp_path / "home")
    record = start_job(spec, store, wait=True, echo=False)
    assert record.status == "Completed", (record.failure_reason,
                                          (store.job_dir("package") / "logs" / "install.log").read_text()[-3000:])
    log = (store.job_dir("package") / "logs" / "algo-1.log").read_text()
    assert "[algo-1 rank 0]<stdout> helper says 42 args ['-x', '1']" in log
    env = store.job_dir("package") / "env"
    assert list(env.glob("lib/python*/site-packages/helperlib.py")) and list(env.glob("lib/python*/site-packages/trainer"))
    assert not list(env.glob("lib/python*/site-packages/numpy"))
    assert "Requirement already satisfied: numpy" in (store.job_dir("package") / "logs" / "install.log").read_text()

    (src / "run.sh").write_text('echo "shell got $# args: $*"; echo "host $SM_CURRENT_HOST" >&2\n')
    spec = parse_spec({"entry_point": "run.sh", "source_dir": str(helper.parent / "pkg"), "job_name": "shell",
                       "hyperparameters": {"epochs": 2}})
    (src / "setup.py").unlink()
    (src / "requirements.txt").unlink()
    record = start_job(spec, store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    log = (store.job_dir("shell") / "logs" / "algo-1.log").read_text()
    assert "<stdout> shell got 2 args: --epochs 2" in log and "<stderr> host algo-1" in log


def test_install_failure_is_a_clear_reason(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("")
    (src / "requirements.txt").write_text("no-such-package-hora-test==1.0\n")
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": "bad-reqs",
                       "environment": {"PIP_NO_INDEX": "1"}})
    record = start_job(spec, JobStore(tmp_path / "home"), wait=True, echo=False)
    assert record.status == "Failed"
    assert record.failure_reason.startswith("ClientError: installing requirements.txt failed (pip exit code 1)")
    assert "no-such-package-hora-test" in record.failure_reason


def test_cli_run_wait_prints_progress_and_summary(tmp_path, capfd):
    code = main(["job", "--home", str(tmp_path / "home"), "run", str(EXAMPLE), "--wait", "--job-name", "cli"])
    captured = capfd.readouterr()
    assert code == 0, captured.err
    assert "hora job: InProgress / Downloading: staging input channels" in captured.err
    assert "job cli: Completed (Completed) after" in captured.err
    assert re.search(r"^model: +\S+/cli/output/model\.tar\.gz$", captured.err, re.M)
    # the ranks' output is shown while it runs, tagged with host and rank
    assert "[algo-1 rank 0] epoch 8: train_loss=" in captured.out
    assert main(["job", "--home", str(tmp_path / "home"), "run", str(EXAMPLE), "--job-name", "cli"]) == 2
    assert "a job named 'cli' already exists" in capfd.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("entry_point: nope.py\nmax_runn: 3\n")
    assert main(["job", "--home", str(tmp_path / "home"), "run", str(bad)]) == 2
    err = capfd.readouterr().err
    assert "has 2 problems" in err and "did you mean 'max_run'?" in err
    assert main(["job", "--home", str(tmp_path / "home"), "describe", "nope"]) == 2
    assert "no job named 'nope'" in capfd.readouterr().err
    assert main(["job", "--home", str(tmp_path / "home"), "logs", "cli", "--folow"]) == 2  # issue 27, item 3
    assert "hora job logs: error: unrecognized argument '--folow'; did you mean --follow?" in capfd.readouterr().err
    # hora job rm: the name is free again, the artifacts kept unless asked (issue 27, item 3)
    store = JobStore(tmp_path / "home")
    created = int(store.get("cli").created)
    assert main(["job", "--home", str(tmp_path / "home"), "rm", "cli"]) == 0
    kept = tmp_path / "home" / "artifacts" / f"cli-{created}"
    assert f"removed job cli (kept {kept / 'model.tar.gz'}, {kept / 'output.tar.gz'})" in capfd.readouterr().out
    assert members(str(kept / "model.tar.gz")) and not store.job_dir("cli").exists()
    store.create("cli", {})  # the name can be used again; a job that has not ended is not removed
    assert main(["job", "--home", str(tmp_path / "home"), "rm", "cli"]) == 2
    assert "job cli is InProgress: stop it first (hora job stop cli --wait)" in capfd.readouterr().err
    store.transition("cli", JobStatus.Failed, SecondaryStatus.Failed)
    assert main(["job", "--home", str(tmp_path / "home"), "rm", "cli", "--artifacts"]) == 0
    assert [r.name for r in store.jobs()] == []


def test_output_path_gets_the_sagemaker_layout(tmp_path):
    _, record = run_script(tmp_path, "", "to-output", output_path=str(tmp_path / "bucket"))
    assert record.artifacts == {
        "model": str(tmp_path / "bucket" / "to-output" / "output" / "model.tar.gz"),
        "output": str(tmp_path / "bucket" / "to-output" / "output" / "output.tar.gz"),
    }
    assert members(record.artifacts["model"]) == {}


def test_logs_follow_until_the_end(tmp_path, capsys):
    script = "import sys, time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n" \
             "print('to stderr', file=sys.stderr)\n"
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(script)
    store = JobStore(tmp_path / "home")
    start_job(parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": "follow",
                          "instance_count": 2}), store, wait=False)
    assert main(["job", "--home", str(store.home), "logs", "--follow", "follow", "--host", "algo-2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("]", 1)[1] for line in lines] == [f"<stdout> tick {i}" for i in range(5)] + ["<stderr> to stderr"]
    assert all("[algo-2 rank 1]" in line for line in lines)
    assert store.get("follow").status == "Completed"
    assert main(["job", "--home", str(store.home), "logs", "follow", "--host", "algo-3"]) == 2
    assert "job follow has no host 'algo-3'; its hosts are algo-1, algo-2" in capsys.readouterr().err


def test_estimator_fit_from_the_main_thread_and_from_another(tmp_path, monkeypatch):
    import threading

    from hora.jobs import Estimator

    monkeypatch.chdir(EXAMPLE.parent)
    est = Estimator(entry_point="train.py", instance_count=2, processes_per_host=1, distribution="allreduce",
                    hyperparameters={"epochs": 2}, home=str(tmp_path / "home"))
    record = est.fit("data", job_name="fit-main", logs=False)
    assert record.status == "Completed", record.failure_reason
    assert est.model_data == record.artifacts["model"] and "weights.npy" in members(est.model_data)
    # off the main thread the job gets its own supervisor process (signals for max_run/stop need a main thread)
    out: list = []
    t = threading.Thread(target=lambda: out.append(est.fit({"training": "data"}, job_name="fit-thread", logs=False)))
    t.start()
    t.join(timeout=240)
    assert not t.is_alive() and out[0].status == "Completed", out
    assert out[0].supervisor_pid != record.supervisor_pid


def test_estimator_fit_raises_the_sdks_exception_when_the_job_fails(tmp_path, monkeypatch):
    from hora.errors import UnexpectedStatusException
    from hora.jobs import PyTorch

    (tmp_path / "train.py").write_text("import sys\nprint('bad input', file=sys.stderr)\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    est = PyTorch(entry_point="train.py", role="SageMakerRole", framework_version="2.1", py_version="py310",
                  instance_count=1, instance_type="ml.c5.xlarge", home=str(tmp_path / "home"))  # fmt: skip
    with pytest.raises(UnexpectedStatusException) as info:
        est.fit(job_name="fails", logs=False)
    assert info.value.actual_status == "Failed"
    assert "Error for Training job fails: Failed. Reason: AlgorithmError" in str(info.value)
    assert "exit code 3" in str(info.value)
    job = est.latest_training_job
    assert job is not None and job.name == "fails"
    desc = job.describe()
    assert desc["TrainingJobStatus"] == "Failed" and "exit code 3" in desc["FailureReason"]
    assert est.model_data == desc["ModelArtifacts"]["S3ModelArtifacts"]  # artifacts are archived even on failure


def test_a_dead_supervisor_fails_the_job_and_takes_the_ranks_along(tmp_path):
    import os
    import signal

    from hora._proc import process_alive, process_start_time

    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent("""
        import os, time
        open(os.path.join(os.environ["SM_MODEL_DIR"], "..", "checkpoints", f"pid-{os.environ['HORA_RANK']}"),
             "w").write(str(os.getpid()))
        time.sleep(300)
    """))
    store = JobStore(tmp_path / "home")
    start_job(parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": "orphan",
                          "processes_per_host": 2}), store, wait=False)
    pid_files = [store.job_dir("orphan") / "hosts" / "algo-1" / "checkpoints" / f"pid-{r}" for r in range(2)]
    deadline = time.monotonic() + 120
    while not all(p.exists() and p.read_text() for p in pid_files):
        assert time.monotonic() < deadline and not store.get("orphan").done
        time.sleep(0.1)
    scripts = [(pid, process_start_time(pid)) for pid in (int(p.read_text()) for p in pid_files)]
    supervisor = store.get("orphan").supervisor_pid
    os.kill(supervisor, signal.SIGKILL)
    record = wait_job(store, "orphan", timeout=60)
    assert (record.status, record.secondary_status) == ("Failed", "Failed")
    assert "supervisor (pid" in record.failure_reason and "died without finishing the job" in record.failure_reason
    deadline = time.monotonic() + 30
    while any(process_alive(pid, start) for pid, start in scripts):
        assert time.monotonic() < deadline, "the scripts outlived their supervisor"
        time.sleep(0.1)
    # its hosts' network namespaces and bridge (when it had them) go with it, removed by its reaper, not left for
    # the next job to sweep away (issue 27, item 11)
    plan = json.loads((store.job_dir("orphan") / "hora" / "plan.json").read_text())
    if plan["network"] == "namespace":
        deadline = time.monotonic() + 30
        while True:
            listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
            left = [n for n in plan["namespaces"] if n in listing] + ([f"hjb{supervisor}"] * (f" hjb{supervisor}:" in links))
            if not left:
                break
            assert time.monotonic() < deadline, f"left behind: {left}"
            time.sleep(0.1)


def test_a_leftover_background_process_does_not_hang_the_job(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "run.sh").write_text("sleep 120 &\necho started the background job\n")
    store = JobStore(tmp_path / "home")
    record = start_job(parse_spec({"entry_point": "run.sh", "source_dir": str(src), "job_name": "leftover"}),
                       store, wait=True, echo=False)
    assert record.status == "Completed", record.failure_reason
    log = (store.job_dir("leftover") / "logs" / "algo-1.log").read_text()
    assert "started the background job" in log and "still holds its output open" in log


def test_max_run_during_the_install_stops_pip_and_its_children(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("")
    slow = tmp_path / "slowpkg"
    slow.mkdir()
    (slow / "setup.py").write_text(textwrap.dedent(f"""
        import os, time
        from setuptools import setup
        open({str(tmp_path / 'build.pid')!r}, "w").write(str(os.getpid()))
        time.sleep(300)
        setup(name="slowpkg", version="1.0", py_modules=[])
    """))
    (src / "requirements.txt").write_text(f"{slow}\n")
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": "slow-install", "max_run": 4,
                       "environment": {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}})
    store = JobStore(tmp_path / "home")
    record = start_job(spec, store, wait=True, echo=False)
    assert (record.status, record.secondary_status) == ("Stopped", "MaxRuntimeExceeded"), record.failure_reason
    assert (tmp_path / "build.pid").exists(), (store.job_dir("slow-install") / "logs" / "install.log").read_text()
    assert Path(record.artifacts["model"]).is_file()
    build = Path(f"/proc/{int((tmp_path / 'build.pid').read_text())}/stat")  # pip's build child, killed with pip
    deadline = time.monotonic() + 30
    while _running(build):
        assert time.monotonic() < deadline, "pip's build process outlived the stopped job"
        time.sleep(0.1)


def test_local_checkpoint_path_is_synced_in_and_out(tmp_path):
    script = """
        import os
        ckpt = os.path.join(os.environ["SM_MODEL_DIR"], "..", "checkpoints")
        print("found", sorted(os.listdir(ckpt)))
        open(os.path.join(ckpt, "step-" + os.environ["SM_CURRENT_HOST"] + "-" + os.environ["SM_HP_RUN"]), "w").close()
    """
    shared = tmp_path / "ckpt"
    shared.mkdir()
    (shared / "seed").write_text("from an earlier job")
    store, first = run_script(tmp_path, script, "ckpt-1", instance_count=2, checkpoint_path=str(shared),
                              hyperparameters={"run": 1})
    assert first.status == "Completed", first.failure_reason
    assert sorted(p.name for p in shared.iterdir()) == ["seed", "step-algo-1-1", "step-algo-2-1"]
    _, second = run_script(tmp_path, script, "ckpt-2", instance_count=2, checkpoint_path=str(shared),
                           hyperparameters={"run": 2})
    assert second.status == "Completed", second.failure_reason
    log = (store.job_dir("ckpt-2") / "logs" / "algo-2.log").read_text()
    assert "found ['seed', 'step-algo-1-1', 'step-algo-2-1']" in log


PIPE_SCRIPT = """
    import json, os
    import hora.numpy as hvd
    from hora.data import PipeDataset

    hvd.init()
    ds = PipeDataset("training")  # the FIFOs training_0, training_1, ... one per pass
    epochs = [[line.strip() for line in ds] for _ in range(3)]
    everyone = hvd.allgather_object(epochs)
    host = os.environ["SM_CURRENT_HOST"]
    with open(os.path.join(os.environ["SM_MODEL_DIR"], f"pipe-{host}.json"), "w") as f:
        json.dump({"mine": epochs, "everyone": everyone}, f)
"""


def test_pipe_mode_job_reads_several_epochs_from_fifos(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        (data / f"part-{i}.txt").write_text("".join(f"record-{i}-{j}\n" for j in range(3)))
    _store, record = run_script(tmp_path, PIPE_SCRIPT, "pipe-job", instance_count=2, processes_per_host=1,
                               input_mode="Pipe",
                               inputs={"training": {"uri": str(data), "distribution": "ShardedByS3Key"}})
    assert record.status == "Completed", record.failure_reason
    got = json.loads(members(record.artifacts["model"])["pipe-algo-1.json"])
    shard = [[f"record-{i}-{j}" for i in (0, 2) for j in range(3)], [f"record-{i}-{j}" for i in (1, 3) for j in range(3)]]
    assert got["mine"] == [shard[0]] * 3  # the same records in every epoch, each epoch a fresh FIFO
    assert [e[0] for e in got["everyone"]] == shard


MISMATCHED_BARRIERS = """
    import numpy as np
    import hora.numpy as hvd
    hvd.init()
    hvd.barrier()
    if hvd.rank() == 0:
        hvd.barrier()  # one barrier more than rank 1 ...
    else:
        hvd.allreduce(np.ones(2), name="only-rank-1")  # ... which waits in another collective: neither ever ends
"""


def test_an_unattended_job_never_hangs_forever_in_a_stall(tmp_path):
    """Issue 19, item 11: hora job turns the stall shutdown on (10x the warning time) unless the spec chooses."""
    _, record = run_script(tmp_path, MISMATCHED_BARRIERS, "stalled", processes_per_host=2, max_run=90,
                           distribution={"mpi": {"enabled": True,
                                                 "custom_mpi_options": "--stall-check-warning-time-seconds 0.5"}})
    assert record.status == "Failed", record.failure_reason  # not Stopped by max_run
    # one or both collectives, by when each rank reached its own: the younger may still be under 5 s at the verdict
    assert re.search(r"StallError: stalled: [12] collective\(s\) waited more than 5s \(HORA_STALL_SHUTDOWN_TIME_SECONDS\)",
                     record.failure_reason), record.failure_reason


def test_horovods_never_ending_stall_stays_reachable():
    from hora.jobs.lifecycle import unattended_settings

    assert unattended_settings({}, {})["stall_shutdown_time"] == 600.0
    assert unattended_settings({"stall_check_time": 2.0}, {})["stall_shutdown_time"] == 20.0
    assert unattended_settings({}, {"HOROVOD_STALL_CHECK_TIME_SECONDS": "3"})["stall_shutdown_time"] == 30.0
    assert unattended_settings({"stall_shutdown_time": 0.0}, {}) == {"stall_shutdown_time": 0.0}
    assert "stall_shutdown_time" not in unattended_settings({}, {"HORA_STALL_SHUTDOWN_TIME_SECONDS": "0"})
    assert "stall_shutdown_time" not in unattended_settings({"stall_check_disable": True}, {})


def test_a_daemon_the_script_double_forks_is_ended_with_the_job(tmp_path, capfd):
    """Issue 27, item 6: the job reported Completed while a setsid daemon kept running in its deleted namespace."""
    import os

    marker = f"hora-jobdaemon-{os.getpid()}"
    script = f"""
        import subprocess
        subprocess.Popen(['setsid', 'sh', '-c', 'exec sleep 600 # {marker}'])
    """
    _, record = run_script(tmp_path, script, "daemon")
    left = [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and marker.encode() in _proc_cmdline(int(e.name))]  # fmt: skip
    for pid in left:
        os.kill(pid, 9)
    assert record.status == "Completed" and left == []
    assert "hora job: algo-1: ended 1 process(es) the job's scripts left running:" in capfd.readouterr().err


def _proc_cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
