"""The lines a remote host's wrapper echoes home with its system metrics, and what the supervisor keeps of them."""

from __future__ import annotations

import json

from hora.jobs.metric_lines import MAX_SYSTEM_SAMPLES, parse_system_metrics_line, system_metrics_line
from hora.jobs.remote_hosts import JobLines
from hora.jobs.store import JobStore


def test_a_batch_goes_home_as_one_line_and_comes_back_the_same():
    batch = [(1700000000.5, "cpu_percent", 42.0), (1700000000.5, "memory_used_bytes", 3.5e9)]
    line = system_metrics_line("algo-2", batch)
    assert "\n" not in line and line.startswith("[algo-2 system] ")
    assert parse_system_metrics_line(line) == ("algo-2", batch)


def test_only_the_samplers_names_and_finite_numbers_are_kept():
    rows = [[1.0, "cpu_percent", 5], [1.0, "os.system", 1.0], [1.0, "cpu_percent", float("nan")],
            [True, "cpu_percent", 1], [1.0, "cpu_percent"], "x", [2.0, "memory_percent", "7"],
            [3.0, "memory_percent", 7.5]]
    got = parse_system_metrics_line("[algo-1 system] " + json.dumps(rows))
    assert got == ("algo-1", [(1.0, "cpu_percent", 5.0), (3.0, "memory_percent", 7.5)])
    assert parse_system_metrics_line("[algo-1 system] {not json") == ("algo-1", [])
    assert parse_system_metrics_line('[algo-1 system] {"a": 1}') == ("algo-1", [])
    many = [[float(i), "cpu_percent", 1.0] for i in range(MAX_SYSTEM_SAMPLES + 5)]
    kept = parse_system_metrics_line("[algo-1 system] " + json.dumps(many))
    assert kept is not None and len(kept[1]) == MAX_SYSTEM_SAMPLES


def test_a_scripts_line_is_never_taken_for_system_metrics():
    # the wrapper tags every line of the script's, so what a script prints starts with its rank's tag
    forged = "[algo-1 rank 0] " + system_metrics_line("algo-1", [(1.0, "cpu_percent", 99.0)])
    assert parse_system_metrics_line(forged) is None
    assert parse_system_metrics_line("[algo-1 rank 0] loss=0.5") is None


def test_the_supervisor_stores_system_lines_and_logs_the_others(tmp_path):
    (tmp_path / "job" / "logs").mkdir(parents=True)
    lines = JobLines(tmp_path / "job", [], str(tmp_path / "home"), "j", 1)
    lines.line("algo-2", "stdout", system_metrics_line("algo-2", [(5.0, "cpu_percent", 12.5)]))
    lines.line("algo-2", "stdout", "[algo-2 rank 1] hello")
    lines.line("algo-2", "stderr", "[algo-2 system] [[6.0, \"cpu_percent\", 1.0]]")  # system lines come on stdout
    lines.close()
    assert list(JobStore(tmp_path / "home").iter_system_metrics("j")) == [("algo-2", 5.0, "cpu_percent", 12.5)]
    log = (tmp_path / "job" / "logs" / "algo-2.log").read_text()
    assert "hello" in log and "12.5" not in log
    assert "[algo-2 system]" in (tmp_path / "job" / "logs" / "algo-1.log").read_text()  # an untagged line, logged
