"""``hora dashboard`` as a user meets it: the real server over a real jobs home, read by headless Chromium.

One running job (it prints metrics, then waits for the test's signal before printing one more line, so a line
printed after the page loaded must appear live), one failed job, and one failed ``hora run --record``; and a Grid
tuning job of three tiny trials that hold their last epoch until the test's signal, so its page must fill in live.
Screenshots go to the test's tmp_path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hora.jobs import (
    CategoricalParameter,
    Estimator,
    HyperparameterTuner,
    JobStore,
    parse_spec,
    start_job,
    wait_job,
)
from hora.jobs.tuning import wait_tuning_job
from hora.jobs.tuning_store import TuningStore

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None, reason="Debian's chromium and chromium-driver (.ci/run installs them)"
)
webdriver = pytest.importorskip("selenium.webdriver")
pytest.importorskip("starlette", reason="the dashboard extra: pip install 'hora[dashboard]'")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

RUNNING = """
    import os, sys, time
    from pathlib import Path
    import numpy as np
    import hora.numpy as hvd
    hvd.init()
    go = Path(sys.argv[sys.argv.index("--go") + 1])
    for step in range(1, 6):
        loss = hvd.allreduce(np.array([1.0 / step]), name="loss")[0]
        print(f"step {step}: loss={loss:.4f}", flush=True)
        time.sleep(0.2)
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    print("printed after the page loaded", flush=True)
    hvd.shutdown()
"""
FAILING = """
    import sys
    print("about to fail: loss=0.75", flush=True)
    raise SystemExit("the data file is missing")
"""
SECRET_VALUE = "env-value-that-must-not-show"
#: A hora run kept with --record: rank 1 comes late to the allreduce (rank 0's stall warning), then fails.
STALLING_RUN = """
import sys, time
import numpy as np
import hora.numpy as hvd
hvd.init()
if hvd.rank() == 1:
    time.sleep(3)
hvd.allreduce(np.ones(2), name="late")
if hvd.rank() == 1:
    sys.exit("rank 1 gives up after the allreduce")
hvd.shutdown()
"""


#: A trial: acc=<width/10 + epoch/100> for epochs 1 and 2, then (once the test says go) epoch 3.
TRIAL = """
    import argparse, time
    from pathlib import Path
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=float)
    p.add_argument("--go")
    a = p.parse_args()
    for epoch in (1, 2, 3):
        if epoch == 3:
            deadline = time.monotonic() + 120
            while not Path(a.go).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        print(f"epoch {epoch}: acc={a.width / 10 + epoch / 100:.4f}", flush=True)
"""


def _job(tmp_path: Path, store: JobStore, name: str, script: str, **fields) -> None:
    src = tmp_path / name
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(script))
    spec = parse_spec({"entry_point": "train.py", "source_dir": str(src), "job_name": name, **fields})
    start_job(spec, store, wait=False)


def _dashboard(home: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "hora", "dashboard", "--home", str(home), "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("hora dashboard: http://"), line + proc.stdout.read()
    return proc, line.split()[2]


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _events(url: str, seconds: float) -> str:
    """What an event stream sends in its first ``seconds``."""
    out = b""
    with urllib.request.urlopen(url, timeout=30) as response:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and b"event: log" not in out:
            out += response.read1(65536)
    return out.decode()


def _browser(tmp_path: Path):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1800",
                f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def test_the_dashboard_shows_jobs_live_in_a_real_browser(tmp_path):
    store = JobStore(tmp_path / "home")
    go = tmp_path / "go"
    metrics = [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}]
    _job(tmp_path, store, "running", RUNNING, hyperparameters={"go": str(go), "lr": 0.5},
         metric_definitions=metrics, environment={"MY_TOKEN": SECRET_VALUE},
         distribution={"mpi": {"enabled": True,
                                "custom_mpi_options": "-x HOROVOD_TIMELINE=/opt/ml/output/data/timeline.json"}})
    _job(tmp_path, store, "failing", FAILING, metric_definitions=metrics)
    recorded = subprocess.run(
        [sys.executable, "-m", "hora", "run", "-np", "2", "--record", "--stall-check-warning-time-seconds", "1",
         sys.executable, "-c", STALLING_RUN],
        env={**os.environ, "HORA_JOB_HOME": str(store.home)}, capture_output=True, text=True, timeout=120)
    assert recorded.returncode == 1, recorded.stderr
    run = recorded.stderr.split("recording this run as ")[1].split()[0]
    proc, url = _dashboard(store.home)
    driver = None
    try:
        driver = _browser(tmp_path)
        # the pages re-render as data arrive: an element read while it is replaced is looked up again next poll
        wait = WebDriverWait(driver, 60, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))
        driver.get(url)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 3)
        assert {r.get_attribute("data-job") for r in driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")} == {
            "running", "failing", run}
        driver.save_screenshot(str(tmp_path / "jobs.png"))

        driver.get(url + "jobs/running")
        wait.until(lambda d: "step 5" in d.find_element(By.ID, "log").text)
        chart = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#metrics .chart[data-metric="loss"]'))[0]
        wait.until(lambda d: int(chart.get_attribute("data-points") or 0) == 5)
        assert chart.find_elements(By.TAG_NAME, "canvas")
        cpu = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#system .chart[data-metric="cpu_percent"]'))[0]
        wait.until(lambda d: int(cpu.get_attribute("data-points") or 0) >= 2)  # the host's samples, as they come
        go.write_text("go")  # only now does the script print its last line
        wait.until(lambda d: "printed after the page loaded" in d.find_element(By.ID, "log").text)
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#status .status").text == "Completed")
        assert SECRET_VALUE not in driver.page_source and "MY_TOKEN (values not shown)" in driver.page_source
        links = wait.until(lambda d: {a.text: a.get_attribute("href")
                                      for a in d.find_elements(By.CSS_SELECTOR, "#downloads a")} or None)
        assert set(links) == {"model (model.tar.gz)", "output (output.tar.gz)", "timeline (timeline.json)"}
        status, timeline = _get(links["timeline (timeline.json)"])
        assert status == 200 and 'allreduce.loss' in timeline and timeline.lstrip().startswith("[")
        driver.save_screenshot(str(tmp_path / "running.png"))

        assert wait_job(store, "failing", timeout=120).status == "Failed"
        driver.get(url + "jobs/failing")
        reason = wait.until(lambda d: d.find_element(By.ID, "failure-reason").text)
        assert "the data file is missing" in reason
        assert "the data file is missing" in (store.get("failing").failure_reason or "")
        driver.save_screenshot(str(tmp_path / "failing.png"))

        # The recorded hora run: its ranks, both ranks' output, rank 0's stall warning, the root-cause table.
        driver.get(url + "jobs/" + run)
        reason = wait.until(lambda d: d.find_element(By.ID, "failure-reason").text)
        assert "rank 1 failed first" in reason and "<- root cause" in reason
        log = wait.until(lambda d: d.find_element(By.ID, "log").text)
        assert "rank 1]<stderr> rank 1 gives up after the allreduce" in log
        assert re.search(r"\[\S+ rank 0\]<stderr> .*(stall|waiting).*", log, re.I), log
        assert "localhost x 2" in driver.find_element(By.ID, "facts").text or "2 process" in driver.find_element(
            By.ID, "facts").text
        driver.save_screenshot(str(tmp_path / "run.png"))

        driver.get(url + "jobs/nope")  # a job that is not there: the server's reason, not an endless "reconnecting"
        banner = wait.until(lambda d: d.find_element(By.ID, "problem").text)
        assert "no job named 'nope'" in banner and driver.find_element(By.ID, "live").text == "stopped"

        driver.get(url + "compare?job=running&job=failing")
        overlay = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#metrics .chart[data-metric="loss"]'))[0]
        wait.until(lambda d: overlay.get_attribute("data-series") == "2" and overlay.find_elements(By.TAG_NAME, "canvas"))
        assert overlay.get_attribute("data-points") == "6"  # the running job's five values, the failing one's one
        driver.save_screenshot(str(tmp_path / "compare.png"))

        # Nothing the server sends shows the job's secret or an environment value.
        secret = (store.job_dir("running") / "hora" / "secret").read_text().strip()
        bodies = [_get(url + path)[1] for path in ("api/jobs", "api/jobs/running", "api/jobs/running/logs",
                                                     "api/jobs/running/metrics", "api/jobs/failing")]
        bodies.append(_events(url + "api/jobs/running/events", 10))
        for body in bodies:
            assert secret not in body and SECRET_VALUE not in body
        assert json.loads(bodies[1])["environment_names"] == ["MY_TOKEN"]
    finally:
        if driver is not None:
            driver.quit()
        _stop(proc)
        for name in ("running", "failing"):
            wait_job(store, name, timeout=120)


def test_a_tuning_job_has_a_live_page_with_its_trials_the_best_and_the_plots(tmp_path):
    home = tmp_path / "home"
    src, go = tmp_path / "trial", tmp_path / "go"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(TRIAL))
    est = Estimator(home=str(home), entry_point="train.py", source_dir=str(src), hyperparameters={"go": str(go)},
                    environment={"MY_TOKEN": SECRET_VALUE}, metric_definitions=[{"Name": "acc", "Regex": r"acc=([0-9.]+)"}])
    tuner = HyperparameterTuner(est, "acc", {"width": CategoricalParameter([1, 3, 2])}, strategy="Grid",
                                max_parallel_jobs=3)
    tuner.fit(job_name="tune", wait=False)
    tstore = TuningStore(JobStore(home))
    proc, url = _dashboard(home)
    driver = None
    try:
        driver = _browser(tmp_path)
        wait = WebDriverWait(driver, 90, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))

        def texts(css: str) -> list[str]:  # the page redraws while it runs: read it in one script, not element-wise
            return driver.execute_script(
                "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)", css)

        def attr(css: str, name: str) -> str | None:
            return driver.execute_script(
                "const e = document.querySelector(arguments[0]); return e && e.getAttribute(arguments[1])", css, name)

        driver.get(url)
        row = wait.until(lambda d: texts('#tuning tbody tr[data-tuning="tune"]'))[0]
        assert "Grid" in row and "Maximize acc" in row
        wait.until(lambda d: len(texts("#jobs tbody tr")) == 3)  # the trials, each marked with a link to it
        assert texts('#jobs a[href="/tuning/tune"]') == ["tune"] * 3

        driver.get(url + "tuning/tune")  # while the trials hold their last epoch
        wait.until(lambda d: len(texts("#trials tbody tr")) == 3)
        wait.until(lambda d: attr("#epochs .chart", "data-points") == "6")  # 3 trials x 2 epochs, so far
        assert attr("#epochs .chart", "data-series") == "3"
        assert driver.find_elements(By.CSS_SELECTOR, "#epochs .chart canvas")
        assert texts("#status .status") == ["InProgress"] and driver.find_element(By.ID, "no-best").is_displayed()
        driver.save_screenshot(str(tmp_path / "tuning-running.png"))
        go.write_text("go")  # only now do the trials print their last epoch and end
        wait.until(lambda d: texts("#status .status") == ["Completed"])
        wait.until(lambda d: attr("#epochs .chart", "data-points") == "9")
        wait.until(lambda d: attr("#objective .chart", "data-points") == "6")  # the final values, the best so far
        assert driver.find_elements(By.CSS_SELECTOR, "#objective .chart canvas")
        best = tuner.best_training_job()
        assert best.startswith("tune-002-")  # width 3, the second of the grid
        assert texts("#best a") == [best]
        assert "0.33" in texts("#best")[0] and "width=3" in texts("#best")[0]
        assert [n[:8] for n in driver.execute_script(
            "return [...document.querySelectorAll('#trials tbody tr')].map((e) => e.dataset.trial)")] == [
            "tune-001", "tune-002", "tune-003"]
        assert texts("#trials td.objective") == ["0.13", "0.33", "0.23"]
        assert attr(f'#trials tr[data-trial="{best}"]', "class") == "best"
        driver.find_element(By.ID, "sort-objective").click()  # best first (the objective is maximised)
        assert texts("#trials td.objective") == ["0.33", "0.23", "0.13"]
        driver.find_element(By.ID, "sort-objective").click()  # then worst first
        assert texts("#trials td.objective") == ["0.13", "0.23", "0.33"]
        assert SECRET_VALUE not in driver.page_source and "MY_TOKEN" not in driver.page_source
        assert sorted(attr("#compare", "href").split("?")[1].split("&")) == sorted(
            f"job={n}" for n in driver.execute_script(
                "return [...document.querySelectorAll('#trials tbody tr')].map((e) => e.dataset.trial)"))
        driver.save_screenshot(str(tmp_path / "tuning.png"))

        driver.find_element(By.CSS_SELECTOR, "#best a").click()  # the best trial's own page, linked back
        wait.until(lambda d: texts("#name") == [best])
        wait.until(lambda d: texts('#facts a[href="/tuning/tune"]') == ["tune"])

        driver.get(url)
        wait.until(lambda d: "3/3" in "".join(texts('#tuning tr[data-tuning="tune"]')))
        row = texts('#tuning tr[data-tuning="tune"]')[0]
        assert "Completed" in row and f"0.33 ({best})" in row

        driver.get(url + "tuning/nope")  # not there: the server's reason, not an endless "reconnecting"
        banner = wait.until(lambda d: d.find_element(By.ID, "problem").text)
        assert "no tuning job named 'nope'" in banner and driver.find_element(By.ID, "live").text == "stopped"
        for path in ("api/tuning", "api/tuning/tune"):
            status, body = _get(url + path)
            assert status == 200 and SECRET_VALUE not in body
    finally:
        if driver is not None:
            driver.quit()
        _stop(proc)
        go.write_text("go")
        wait_tuning_job(tstore, "tune", timeout=120)


def test_on_another_address_every_request_needs_the_token(tmp_path):
    proc, url = _dashboard(tmp_path / "home", "--host", "0.0.0.0")
    try:
        assert "?token=" in url
        port = url.split(":")[2].split("/")[0]
        token = url.split("?token=")[1]
        local = f"http://127.0.0.1:{port}/"
        status, body = _get(local + "api/jobs")
        assert status == 401 and "needs its token" in body
        assert _get(local + "api/jobs", {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(local + "api/jobs", {"Authorization": f"Bearer {token}"}) == (200, '{"jobs":[]}')
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            opener.open(local + f"?token={token}", timeout=30)
            raise AssertionError("the token in the address was not traded for a cookie")
        except urllib.error.HTTPError as exc:
            assert exc.code == 303 and exc.headers["Location"] == "/"
            cookie = exc.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert _get(local, {"Cookie": cookie.split(";")[0]})[0] == 200
    finally:
        _stop(proc)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_a_damaged_index_is_named_with_its_fix_not_a_server_error(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "jobs.db").write_bytes(b"this is not an SQLite database" * 100)
    proc, url = _dashboard(home)
    try:
        status, body = _get(url + "api/jobs")
        assert status == 503 and "reindex" in json.loads(body)["error"]
        with urllib.request.urlopen(url + "api/events", timeout=30) as response:
            first = response.read1(65536).decode()
        assert first.startswith("event: problem\n") and "reindex" in first
    finally:
        _stop(proc)
