"""What a job's page is made of: chosen fields, environment names only, downloads only of known files."""

from __future__ import annotations

from hora.dashboard import data
from hora.jobs.store import JobStore


def _store_with_job(tmp_path, **spec):
    store = JobStore(tmp_path / "home")
    store.create("j", {"entry_point": "train.py", "instance_count": 2, "processes_per_host": 3,
                       "environment": {"API_KEY": "do-not-show"}, "hyperparameters": {"lr": 0.1}, **spec})
    return store


def test_a_job_page_names_environment_variables_without_their_values(tmp_path):
    store = _store_with_job(tmp_path)
    detail = data.job_detail(store, "j")
    assert detail["environment_names"] == ["API_KEY"] and "do-not-show" not in repr(detail)
    assert detail["host_names"] == ["algo-1", "algo-2"] and detail["processes_per_host"] == 3
    assert detail["hyperparameters"] == {"lr": 0.1} and detail["downloads"] == []


def test_downloads_are_local_artifacts_and_the_files_the_job_named(tmp_path):
    store = _store_with_job(tmp_path, mpi_exports={"HOROVOD_TIMELINE": "/opt/ml/output/data/tl.json"},
                            run_settings={"autotune_log_file": "tune.csv"})
    tree = store.job_dir("j") / "hosts" / "algo-1"
    (tree / "output" / "data").mkdir(parents=True)
    (tree / "output" / "data" / "tl.json").write_text("[]")
    (tree / "code").mkdir()
    (tree / "code" / "tune.csv").write_text("a,b\n")
    model = tmp_path / "model.tar.gz"
    model.write_bytes(b"x" * 10)
    store.update("j", artifacts={"model": str(model), "output": "s3://bucket/out/output.tar.gz"})
    found = data.downloads(store.get("j"))
    assert {k: (v["size"], v["path"]) for k, v in found.items()} == {
        "model": (10, model), "timeline": (2, tree / "output" / "data" / "tl.json"),
        "autotune": (4, tree / "code" / "tune.csv")}
    assert all("path" not in d for d in data.job_detail(store, "j")["downloads"])


def test_metric_rows_come_after_the_row_asked_for(tmp_path):
    store = _store_with_job(tmp_path)
    store.add_metrics("j", [("loss", 1.0, 10.0, "algo-1", 0, 1), ("loss", 0.5, 11.0, "algo-1", 0, 1)])
    rows, after = data.metric_rows(store, "j")
    assert rows == [["loss", 1.0, 10.0, "algo-1", 0, 1], ["loss", 0.5, 11.0, "algo-1", 0, 1]]
    store.add_metrics("j", [("loss", 0.25, 12.0, "algo-2", 3, 1)])
    assert data.metric_rows(store, "j", after) == ([["loss", 0.25, 12.0, "algo-2", 3, 1]], after + 1)


def test_a_trial_of_a_tuning_job_is_marked_with_it(tmp_path):
    import json

    store = _store_with_job(tmp_path)
    store.create("tune-001-0a1b2c3d", {"entry_point": "train.py", "hyperparameters": {"lr": 0.2}})
    tuning = store.home / "tuning" / "tune"
    tuning.mkdir(parents=True)
    (tuning / "config.json").write_text("{}")
    (tuning / "state.json").write_text(json.dumps({"trials": [{"name": "tune-001-0a1b2c3d"}]}))
    marks = {job["name"]: job["tuning_job"] for job in data.jobs(store)}
    assert marks == {"j": None, "tune-001-0a1b2c3d": "tune"}
    assert data.job_detail(store, "tune-001-0a1b2c3d")["tuning_job"] == "tune"
