"""The records an attempt's processes leave for the supervisor (hora/attempt-N/): each written whole by one writer
and read back field by field."""

from __future__ import annotations

import json
import re

import pytest

from hora.jobs.records import AttemptResult, HostReport, MasterRecord, RankEnd, attempt_dir
from hora.runner.result import Failure, RunResult


def test_a_ranks_end_survives_its_record(tmp_path):
    ends = [
        RankEnd(0, "algo-1", 4242, 0, (), 1.5),
        RankEnd(3, "algo-2", 4343, -9, ("Traceback (most recent call last):", "  boom"), 2.25),
        RankEnd(
            2, "algo-2", 77, 1, ("ps died",), 3.0, ps_task="TensorFlow parameter server ps:1 at algo-2:2223"
        ),
    ]
    for end in ends:
        end.write(tmp_path, 2)
    assert RankEnd.path(tmp_path, 2, 3) == tmp_path / "hora" / "attempt-2" / "rank-3.json"
    assert RankEnd.read_all(tmp_path, 2) == {e.rank: e for e in ends}
    assert "ps_task" not in json.loads(RankEnd.path(tmp_path, 2, 0).read_text())
    assert not list(attempt_dir(tmp_path, 2).glob("*.tmp"))  # written whole, then renamed


def test_the_masters_record_is_hora_runs_outcome_or_why_it_could_not_start(tmp_path):
    failure = Failure(1, "algo-1", 99, -15, ["line"], 12.5, stopped=True, reason="")
    result = RunResult(143, [0, -15], None, [failure], 15, False, {}, "job-id")
    MasterRecord(result=result).write(tmp_path, 1)
    assert MasterRecord.read(tmp_path, 1) == MasterRecord(result=result)
    MasterRecord(error="HostStartError: no").write(tmp_path, 2)
    assert MasterRecord.read(tmp_path, 2) == MasterRecord(error="HostStartError: no")


def test_host_reports_and_the_attempts_result_survive_their_records(tmp_path):
    HostReport("algo-2", "waited 5s for the master").write(tmp_path, 1)
    assert HostReport.read(tmp_path, 1, "algo-2") == HostReport("algo-2", "waited 5s for the master")
    AttemptResult((0, None, -9), 137, None).write(tmp_path, 1)
    assert AttemptResult.read(tmp_path, 1) == AttemptResult((0, None, -9), 137, None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2]", "is list, not a JSON object"),
        ('{"rank": 0}', "no field 'host'"),
        (
            '{"rank": 0, "host": "algo-1", "pid": 1, "returncode": "0", "tail": [], "ended": 1}',
            "field 'returncode' is '0', not a whole number",
        ),
        (
            '{"rank": 0, "host": "algo-1", "pid": 1, "returncode": 0, "tail": [1], "ended": 1}',
            "field 'tail' is [1], not a list of strings",
        ),
    ],
)
def test_a_rank_record_hora_did_not_write_names_the_wrong_field(tmp_path, text, problem):
    path = RankEnd.path(tmp_path, 1, 0)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(problem)):
        RankEnd.read(path)


def test_other_records_hora_did_not_write_name_the_wrong_field(tmp_path):
    out = attempt_dir(tmp_path, 1)
    out.mkdir(parents=True)
    (out / "result.json").write_text('{"returncodes": "zero", "exit_code": 0, "interrupted": null}')
    with pytest.raises(ValueError, match=r"field 'returncodes' is 'zero', not a list of exit codes"):
        AttemptResult.read(tmp_path, 1)
    master = {"exit_code": 1, "returncodes": [1], "interrupted": None, "timed_out": False, "job_id": "j"}
    (out / "master.json").write_text(json.dumps({**master, "failures": [{"rank": 0}]}))
    with pytest.raises(ValueError, match=r"no field 'failures\[0\]\.host'"):
        MasterRecord.read(tmp_path, 1)
    with pytest.raises(FileNotFoundError):
        HostReport.read(tmp_path, 1, "algo-2")


def test_a_rank_stores_a_bounded_number_of_metric_values_and_says_so_once(tmp_path, monkeypatch, capfd):
    """Issue 27, item 11: 200 MB of matching log lines stored 2 M metric rows (151 MB) and `metrics` then took
    1.6 GB; a rank now keeps at most MAX_METRIC_VALUES (the rest stay in the logs), and `metrics` streams."""
    from types import SimpleNamespace

    from hora.jobs import _entry, metric_lines, views
    from hora.jobs.store import JobStore

    monkeypatch.setattr(metric_lines, "MAX_METRIC_VALUES", 3)
    (tmp_path / "job" / "logs").mkdir(parents=True)
    store = JobStore(tmp_path / "home")
    store.create("bounded", {})
    plan = SimpleNamespace(echo=False, home=str(tmp_path / "home"), job_name="bounded",
                           metric_definitions=[SimpleNamespace(name="loss", regex=r"loss=([0-9.]+)")])  # fmt: skip
    pump = _entry._Pump(plan, tmp_path / "job", "algo-1", 0, 1)
    for step in range(10):
        pump.line("stdout", f"step {step} loss={1.0 / (step + 1)}")
    pump.flush()
    assert [round(v, 3) for _, v, *_ in store.iter_metrics("bounded")] == [1.0, 0.5, 0.333]
    assert capfd.readouterr().err.count("has stored 3 metric values, the most one rank keeps") == 1
    table = list(views.metrics_table(store, "bounded"))
    assert table[0].split() == ["TIME", "METRIC", "VALUE", "HOST", "RANK", "ATTEMPT"] and len(table) == 4
    assert len((tmp_path / "job" / "logs" / "algo-1.log").read_text().splitlines()) == 10  # the logs keep them all
