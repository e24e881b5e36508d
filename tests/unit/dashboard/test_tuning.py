"""What the dashboard shows of a tuning job: its list row and page as JSON (chosen fields, never the trial template's
environment), read through the tuning store, and served by the app (a tuning job that is not there is a 404)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from hora.dashboard import tuning
from hora.jobs import CategoricalParameter, ContinuousParameter, Estimator, HyperparameterTuner
from hora.jobs.store import JobStore
from hora.jobs.tuning_store import TuningStore

SECRET = "do-not-show"


def _tuning_job(tmp_path, trials: list[dict], status: str = "InProgress") -> JobStore:
    """A tuning job "t" as HyperparameterTuner.fit records it (no supervisor: the state is written here)."""
    store = JobStore(tmp_path / "home")
    (tmp_path / "train.py").write_text("print('acc=0.5')\n")
    est = Estimator(home=str(store.home), entry_point="train.py", source_dir=str(tmp_path), hyperparameters={"epochs": 3},
                    environment={"API_KEY": SECRET},
                    metric_definitions=[{"Name": "acc", "Regex": r"acc=([0-9.]+)"}])
    tuner = HyperparameterTuner(est, "acc", {"lr": ContinuousParameter(0.01, 1.0, scaling_type="Logarithmic"),
                                             "bs": CategoricalParameter([16, 64])},
                                strategy="Random", random_seed=5, max_jobs=4, max_parallel_jobs=2)
    config = tuner.tuning_config("t")
    config["template"] = {"entry_point": "train.py", "environment": {"API_KEY": SECRET}}
    config["estimator"] = {"entry_point": "train.py", "environment": {"API_KEY": SECRET}}
    tstore = TuningStore(store)
    tstore.create("t", config)
    state = tstore.state("t")
    state.update(status=status, trials=trials)
    if status != "InProgress":
        state["ended"] = time.time()
    tstore.write_state("t", state)
    return store


def _trial(n: int, status: str, series: list[float], **more) -> dict:
    t0 = time.time() - 100 + n
    ended = status != "InProgress"
    return {"name": f"t-{n:03d}-0000000{n}", "tuned": {"lr": 0.1 * n, "bs": "16"}, "created": t0, "status": status,
            "objective": series[-1] if series and status != "Failed" and ended else None, "started": t0 + 1,
            "ended": t0 + 5 if ended else None, "failure_reason": None, "epochs_checked": 0, "series": series,
            **more}


def test_the_list_row_and_the_page_of_a_running_tuning_job(tmp_path):
    store = _tuning_job(tmp_path, [
        _trial(1, "Completed", [0.5, 0.6, 0.7]),
        _trial(2, "Failed", [0.2], failure_reason="AlgorithmError: boom\nTraceback ..."),
        _trial(3, "Stopped", [0.1, 0.8], failure_reason="stopped early (median rule): ..."),
        _trial(4, "InProgress", [0.9]),
    ])
    [row] = tuning.tuning_jobs(store)
    assert row == {
        "name": "t", "status": "InProgress", "strategy": "Random",
        "objective": {"name": "acc", "type": "Maximize"},
        "trials_done": 3, "trials_started": 4, "max_jobs": 4,
        "best": {"name": "t-003-00000003", "objective": 0.8, "tuned": {"lr": pytest.approx(0.3), "bs": "16"}},
        "created": row["created"], "ended": None, "done": False,
    }
    page = tuning.tuning_detail(store, "t")
    assert {k: page[k] for k in row} == row
    assert page["limits"] == {"max_jobs": 4, "max_parallel_jobs": 2, "max_runtime_in_seconds": None}
    assert (page["early_stopping"], page["random_seed"]) == ("Off", 5)
    assert page["ranges"] == [
        {"name": "lr", "type": "Continuous", "min": "0.01", "max": "1.0", "scaling": "Logarithmic"},
        {"name": "bs", "type": "Categorical", "values": ["16", "64"]}]
    assert page["static_hyperparameters"] == {"epochs": "3"}
    assert page["metric_definitions"] == [{"name": "acc", "regex": "acc=([0-9.]+)"}]
    assert page["failure_reason"] is None and page["stop_requested"] is False
    first, failed, stopped, running = page["trials"]
    assert first == {"index": 1, "name": "t-001-00000001", "tuned": {"lr": pytest.approx(0.1), "bs": "16"},
                     "status": "Completed", "objective": 0.7, "created": first["created"],
                     "started": first["created"] + 1, "ended": first["created"] + 5, "elapsed": pytest.approx(4),
                     "epochs": 3, "reason": None}
    assert failed["objective"] is None and failed["reason"].startswith("AlgorithmError: boom")
    assert stopped["status"] == "Stopped" and stopped["reason"].startswith("stopped early")
    assert running["ended"] is None and running["elapsed"] is None and running["objective"] is None
    assert page["series"] == {"t-001-00000001": [0.5, 0.6, 0.7], "t-002-00000002": [0.2],
                              "t-003-00000003": [0.1, 0.8], "t-004-00000004": [0.9]}
    # chosen fields only: nothing of the trial template or the estimator (their environment values)
    assert SECRET not in json.dumps(page) and "template" not in page and "estimator" not in page
    assert "API_KEY" not in json.dumps(page)


def test_an_ended_tuning_job_without_a_scored_trial_has_no_best_and_says_why_it_ended(tmp_path):
    store = _tuning_job(tmp_path, [_trial(1, "Failed", [])], status="Stopped")
    state = TuningStore(store).state("t")
    state["failure_reason"] = "stopped by request"
    TuningStore(store).write_state("t", state)
    page = tuning.tuning_detail(store, "t")
    assert page["best"] is None and page["done"] is True and page["ended"] is not None
    assert page["failure_reason"] == "stopped by request" and page["trials_done"] == 1


def test_a_tuning_job_being_created_is_left_out_of_the_list_until_its_state_is_written(tmp_path):
    store = _tuning_job(tmp_path, [_trial(1, "Completed", [0.5])], status="Completed")
    (store.home / "tuning" / "new").mkdir()
    (store.home / "tuning" / "new" / "config.json").write_text((store.home / "tuning" / "t" / "config.json").read_text())
    assert sorted(TuningStore(store).names()) == ["new", "t"]
    assert [t["name"] for t in tuning.tuning_jobs(store)] == ["t"]


def _get(app, path: str) -> tuple[int, dict]:
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"127.0.0.1:8585")], "scheme": "http", "server": ("127.0.0.1", 8585),
             "root_path": "", "http_version": "1.1", "client": ("127.0.0.1", 50000)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def test_the_app_serves_the_list_and_the_page_and_404s_an_unknown_tuning_job(tmp_path):
    pytest.importorskip("starlette", reason="the dashboard extra")
    from hora.dashboard.app import create_app

    store = _tuning_job(tmp_path, [_trial(1, "Completed", [0.5, 0.7])], status="Completed")
    app = create_app(store.home)
    status, listed = _get(app, "/api/tuning")
    assert status == 200 and [t["name"] for t in listed["tuning_jobs"]] == ["t"]
    status, page = _get(app, "/api/tuning/t")
    assert status == 200 and page["best"]["name"] == "t-001-00000001" and page["series"] == {
        "t-001-00000001": [0.5, 0.7]}
    status, missing = _get(app, "/api/tuning/nope")
    assert status == 404 and "no tuning job named 'nope'" in missing["error"]
