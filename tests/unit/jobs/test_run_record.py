"""hora run --record's store entry, driven through the calls the launcher makes (no ranks needed)."""

from __future__ import annotations

import re

from hora.jobs import views
from hora.jobs.run_record import RunRecorder
from hora.jobs.store import JobStore


def test_a_recorded_run_is_a_store_entry_with_its_hosts_lines_and_root_cause(tmp_path):
    store = JobStore(tmp_path / "home")
    rec = RunRecorder(store, ["python", "-c", "print(1)\nprint(2)"], 3)
    assert re.fullmatch(r"run-\d{8}-\d{6}-[0-9a-f]{4}", rec.name)
    rec.started([(0, "localhost"), (1, "localhost"), (2, "node-b")])
    rec.line("2", "stderr", "a warning")
    rec.line("0", "stdout", "hello")
    rec.line("ps0", "stdout", "server up")
    rec.ended(1, "hora run: rank 2 failed first")
    r = store.get(rec.name)
    assert (r.status, r.secondary_status, r.exit_code) == ("Failed", "Failed", 1)
    assert r.failure_reason == "hora run: rank 2 failed first" and r.host_names == ["localhost", "node-b"]
    assert r.spec["kind"] == "run" and r.spec["ranks"] == [[0, "localhost"], [1, "localhost"], [2, "node-b"]]
    logs = list(views.read_logs(store, rec.name))
    assert sorted(line[25:] for line in logs) == [  # a host's lines in its own log, tagged as a job's
        "[localhost ps0]<stdout> server up", "[localhost rank 0]<stdout> hello", "[node-b rank 2]<stderr> a warning"]
    job_log = (tmp_path / "home" / "jobs" / rec.name / "logs" / "job.log").read_text().splitlines()
    assert len(job_log) == 3 and job_log[0].endswith("print(1)\\nprint(2)'")  # one line per note
    assert "Kind:              hora run (kept with --record)" in views.describe(store, rec.name)
    assert (tmp_path / "home" / "jobs" / rec.name / "hora" / "record.json").is_file()


def test_a_run_stopped_by_request_ends_stopped_and_a_success_has_no_reason(tmp_path):
    store = JobStore(tmp_path / "home")
    stopped = RunRecorder(store, ["true"], 1)
    stopped.started([(0, "localhost")])
    store.update(stopped.name, stop_requested=1)  # what hora job stop does before its SIGTERM
    stopped.ended(143, "hora run: stopped by SIGTERM")
    assert store.get(stopped.name).status == "Stopped"
    ok = RunRecorder(store, ["true"], 1)
    ok.started([(0, "localhost")])
    ok.ended(0, "")
    assert (store.get(ok.name).status, store.get(ok.name).failure_reason) == ("Completed", None)


def test_a_store_that_cannot_be_written_stops_the_recording_not_the_run(tmp_path, capsys):
    home = tmp_path / "home"
    home.write_text("not a directory")
    rec = RunRecorder(JobStore(home), ["true"], 1)
    rec.started([(0, "localhost")])
    rec.line("0", "stdout", "still fine")
    rec.ended(0, "")
    err = capsys.readouterr().err
    assert err.count("--record stopped recording this run") == 1
