"""System metrics of a job: the spec's profiler_config (and the Estimator's profiler_config= / disable_profiler=),
the plan's sampling interval, and the job store's system_metrics table."""

from __future__ import annotations

import sqlite3

import pytest

from hora.errors import ConfigError, StorageError
from hora.jobs import Estimator, JobStore, SpecError, parse_spec
from hora.jobs.plan import JobPlan
from hora.jobs.spec import spec_from_dict


@pytest.fixture
def code(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def interval(code, profiler_config=..., **more):
    data = {"entry_point": "train.py", **more}
    if profiler_config is not ...:
        data["profiler_config"] = profiler_config
    return parse_spec(data, base_dir=code).system_monitor_interval_millis


def test_system_monitoring_is_on_at_sagemakers_500_ms_unless_disabled(code):
    assert interval(code) == 500 and interval(code, None) == 500 and interval(code, {}) == 500
    assert interval(code, {"system_monitor_interval_millis": 100}) == 100
    assert interval(code, {"ProfilingIntervalInMilliseconds": 60000}) == 60000  # the API's names too
    assert interval(code, {"disable_profiler": True}) is None
    assert interval(code, {"DisableProfiler": True, "system_monitor_interval_millis": 200}) is None
    assert interval(code, {"s3_output_path": "s3://b/p", "disable_profiler": False}) == 500  # accepted, no effect
    spec = parse_spec({"entry_point": "train.py", "profiler_config": {"disable_profiler": True}}, base_dir=code)
    assert spec_from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"system_monitor_interval_millis": 300}, "must be one of 100, 200, 500, 1000, 5000, 60000"),
        ({"system_monitor_interval_millis": "500"}, "got '500'"),
        ({"system_monitor_interval_millis": True}, "got True"),
        ({"disable_profiler": "yes"}, "disable_profiler must be true or false"),
        ({"system_monitor_interval": 500}, "did you mean 'system_monitor_interval_millis'"),
        ({"disable_profiler": True, "DisableProfiler": True}, "gives disable_profiler twice"),
        ([500], "profiler_config must be a mapping"),
    ],
)
def test_a_wrong_profiler_config_is_named_with_the_fix(code, value, problem):
    with pytest.raises(SpecError) as info:
        parse_spec({"entry_point": "train.py", "profiler_config": value, "max_run": -1}, base_dir=code)
    problems = info.value.problems
    assert len(problems) == 2 and any("max_run" in p for p in problems)  # reported with the others, in one error
    assert any(problem in p and "profiler_config" in p for p in problems), problems


class SdkProfilerConfig:
    """The attributes of sagemaker.debugger.ProfilerConfig (the SDK is not a dependency of the tests)."""

    def __init__(self, s3_output_path=None, system_monitor_interval_millis=None, framework_profile_params=None,
                 profile_params=None, disable_profiler=False):
        self.s3_output_path = s3_output_path
        self.system_monitor_interval_millis = system_monitor_interval_millis
        self.framework_profile_params = framework_profile_params
        self.profile_params = profile_params
        self.disable_profiler = disable_profiler


def test_the_estimator_takes_profiler_config_and_disable_profiler(code, caplog):
    home = str(code / "home")
    est = Estimator(entry_point=str(code / "train.py"), home=home,
                    profiler_config=SdkProfilerConfig(system_monitor_interval_millis=1000))
    assert est.fields["profiler_config"] == {"system_monitor_interval_millis": 1000, "disable_profiler": False}
    assert parse_spec(est.fields).system_monitor_interval_millis == 1000
    est = Estimator(entry_point=str(code / "train.py"), home=home, disable_profiler=True)
    assert parse_spec(est.fields).system_monitor_interval_millis is None
    est = Estimator(entry_point=str(code / "train.py"), home=home, profiler_config={"disable_profiler": True},
                    disable_profiler=True)
    assert parse_spec(est.fields).system_monitor_interval_millis is None
    assert not any("profiler" in r.getMessage() for r in caplog.records)  # no longer "has no effect here"
    with pytest.raises(ConfigError, match=r"profiler_config\.disable_profiler cannot be False when disable_profiler"):
        Estimator(entry_point=str(code / "train.py"), home=home, disable_profiler=True,
                  profiler_config=SdkProfilerConfig(system_monitor_interval_millis=100))
    with pytest.raises(SpecError, match="system_monitor_interval_millis must be one of"):
        Estimator(entry_point=str(code / "train.py"), home=home,
                  profiler_config=SdkProfilerConfig(system_monitor_interval_millis=250))
    with pytest.raises(ConfigError, match="disable_profiler must be True or False"):
        Estimator(entry_point=str(code / "train.py"), home=home, disable_profiler="true")
    with pytest.raises(ConfigError, match=r"must be a sagemaker\.debugger\.ProfilerConfig or a mapping"):
        Estimator(entry_point=str(code / "train.py"), home=home, profiler_config=500)


def test_the_plan_carries_the_interval_and_reads_an_older_plan_without_it():
    plan = JobPlan(
        job_name="j", home="/tmp/home", hosts=("algo-1",), addresses=("127.0.0.1",), network="loopback",
        namespaces=(), interface="lo", master_timeout=1.0, connect_timeout=1.0, grace=1.0, run_settings={},
        mpi_exports={}, processes_per_host=1, command=("python", "t.py"), python="python", strategy="none",
        parameter_server=None, metric_definitions=(), echo=False, system_monitor_interval=0.1,
    )
    assert JobPlan.from_json(plan.to_json()).system_monitor_interval == 0.1
    older = plan.to_json().replace('"system_monitor_interval": 0.1', '"unused": 0')
    assert JobPlan.from_json(older).system_monitor_interval is None
    with pytest.raises(StorageError, match="field 'system_monitor_interval' is -1"):
        JobPlan.from_json(plan.to_json().replace('"system_monitor_interval": 0.1', '"system_monitor_interval": -1'))


def test_the_store_keeps_system_metrics_in_time_order_and_forgets_them_with_the_job(tmp_path):
    store = JobStore(tmp_path / "home")
    for name in ("a", "b"):
        store.create(name, {"job_name": name})
    store.add_system_metrics("a", [("algo-2", 2.0, "cpu_percent", 50.0), ("algo-2", 2.0, "memory_used_bytes", 7.0)])
    store.add_system_metrics("a", [("algo-1", 1.0, "cpu_percent", 25.0), ("algo-1", 3.0, "cpu_percent", 75.0)])
    store.add_system_metrics("b", [("algo-1", 1.5, "cpu_percent", 1.0)])
    assert list(store.iter_system_metrics("a")) == [
        ("algo-1", 1.0, "cpu_percent", 25.0), ("algo-2", 2.0, "cpu_percent", 50.0),
        ("algo-2", 2.0, "memory_used_bytes", 7.0), ("algo-1", 3.0, "cpu_percent", 75.0)]
    assert [r[1] for r in store.iter_system_metrics("a", since=2.0)] == [2.0, 2.0, 3.0]
    store.remove("a")
    with sqlite3.connect(store.db_path) as db:
        assert db.execute("SELECT job FROM system_metrics").fetchall() == [("b",)]
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "system_metrics_job" in indexes
    assert list(store.iter_system_metrics("b")) == [("algo-1", 1.5, "cpu_percent", 1.0)]


def test_an_index_from_before_system_metrics_gains_the_table(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(home / "jobs.db") as db:
        db.execute("CREATE TABLE metrics (job TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, "
                   "timestamp REAL NOT NULL, host TEXT NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL)")
    db.close()
    store = JobStore(home)
    assert list(store.iter_system_metrics("old")) == []
    store.add_system_metrics("old", [("algo-1", 1.0, "cpu_percent", 3.0)])
    assert list(store.iter_system_metrics("old")) == [("algo-1", 1.0, "cpu_percent", 3.0)]


def test_the_system_metrics_table_lists_every_sample_and_says_why_there_are_none(tmp_path):
    from hora.jobs import views

    store = JobStore(tmp_path / "home")
    store.create("on", {"job_name": "on", "system_monitor_interval_millis": 500})
    store.create("off", {"job_name": "off", "system_monitor_interval_millis": None})
    assert list(views.system_metrics_table(store, "on")) == [
        "job on has no system metrics (yet: each host writes its samples every few seconds)"]
    assert list(views.system_metrics_table(store, "off")) == [
        "job off has no system metrics (its profiler_config disables them)"]
    store.add_system_metrics("on", [("algo-1", 1.5, "cpu_percent", 12.25), ("algo-2", 2.5, "memory_used_bytes", 2e9)])
    lines = list(views.system_metrics_table(store, "on"))
    assert lines[0].split() == ["TIME", "HOST", "METRIC", "VALUE"]
    assert [line.split()[1:] for line in lines[1:]] == [
        ["algo-1", "cpu_percent", "12.25"], ["algo-2", "memory_used_bytes", "2000000000"]]
    with pytest.raises(ConfigError, match="no job named 'nope'"):
        list(views.system_metrics_table(store, "nope"))
