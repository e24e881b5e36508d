"""The dashboard's web application: three pages, a JSON API, and server-sent event streams that keep pages live.

Pages (static files of this package, no CDN): ``/`` the job and tuning job lists, ``/jobs/NAME`` a job,
``/tuning/NAME`` a tuning job, ``/compare?job=A&job=B`` several jobs' metrics overlaid. API: ``/api/jobs``,
``/api/jobs/NAME``, ``/api/jobs/NAME/metrics``, ``/api/jobs/NAME/logs?host=&rank=&lines=``,
``/api/jobs/NAME/system``, ``/api/jobs/NAME/download/KEY``, ``/api/tuning``, ``/api/tuning/NAME``.

Streams (``text/event-stream``): ``/api/events`` sends the job list (``jobs``) and the tuning job list (``tuning``)
whenever they change; ``/api/jobs/NAME/events?host=&rank=&logs=0`` sends the job's page state once (``job``,
``metrics``, ``system``, ``log`` events) and then only what changed, every :data:`POLL` seconds;
``/api/tuning/NAME/events`` likewise (``tuning``: the tuning job and its trials; ``series``: the trials' objective
values by epoch, then only the trials whose values changed). A reconnecting browser gets the state once more and
replaces what it had.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from hora.dashboard import data, tuning
from hora.dashboard.access import Access
from hora.dashboard.logs import LogFollower, log_sources
from hora.errors import ConfigError, StorageError
from hora.jobs.store import JobStore

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"
#: Seconds between two looks at the store and the logs for a live stream.
POLL = 0.5
#: Seconds between two keep-alive comments on a quiet stream (proxies and browsers drop silent connections).
KEEPALIVE = 15.0
#: Log lines a page gets at first.
TAIL_LINES = 500
T = TypeVar("T")
N = TypeVar("N", int, float)


def create_app(home: str | Path | None, token: str | None = None, poll: float = POLL) -> Access:
    """The application over the jobs home ``home``, behind :class:`~hora.dashboard.access.Access`."""
    store = JobStore(home)

    async def call(fn: Callable[..., T], *args: Any) -> T:
        return await run_in_threadpool(fn, *args)

    async def job_or_404(name: str) -> dict[str, Any]:
        try:
            return await call(data.job_detail, store, name)
        except ConfigError as exc:
            raise _NotFound(str(exc)) from None

    async def tuning_or_404(name: str) -> dict[str, Any]:
        try:
            return await call(tuning.tuning_detail, store, name)
        except ConfigError as exc:
            raise _NotFound(str(exc)) from None

    def page(file: str) -> Callable[[Request], Any]:
        async def serve(request: Request) -> Response:
            return FileResponse(STATIC / file, media_type="text/html")

        return serve

    async def api_jobs(request: Request) -> Response:
        return JSONResponse({"jobs": await call(data.jobs, store)})

    async def api_job(request: Request) -> Response:
        return JSONResponse(await job_or_404(request.path_params["name"]))

    async def api_metrics(request: Request) -> Response:
        name = request.path_params["name"]
        await job_or_404(name)
        rows, last = await call(data.metric_rows, store, name, _number(request, "after", 0, int))
        return JSONResponse({"rows": rows, "after": last})

    async def api_system(request: Request) -> Response:
        name = request.path_params["name"]
        await job_or_404(name)
        rows, last = await call(data.system_rows, store, name, _number(request, "since", 0.0, float))
        return JSONResponse({"rows": rows, "since": last})

    async def api_logs(request: Request) -> Response:
        name = request.path_params["name"]
        job = await job_or_404(name)
        follower = _follower(store, job, request)
        lines = await call(follower.tail, _number(request, "lines", TAIL_LINES, int))
        return JSONResponse({"lines": lines})

    async def api_download(request: Request) -> Response:
        name = request.path_params["name"]
        await job_or_404(name)
        found = (await call(data.downloads, store.get(name))).get(request.path_params["key"])
        if found is None:
            raise _NotFound(f"job {name} has no download {request.path_params['key']!r}")
        return FileResponse(found["path"], filename=f"{name}-{found['path'].name}")

    async def api_tuning_jobs(request: Request) -> Response:
        return JSONResponse({"tuning_jobs": await call(tuning.tuning_jobs, store)})

    async def api_tuning_job(request: Request) -> Response:
        return JSONResponse(await tuning_or_404(request.path_params["name"]))

    async def list_events(request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            last: dict[str, str] = {}
            while True:
                lists = {"jobs": await call(data.jobs, store), "tuning": await call(tuning.tuning_jobs, store)}
                for kind, key in (("jobs", "jobs"), ("tuning", "tuning_jobs")):
                    text = json.dumps({key: lists[kind]})
                    if text != last.get(kind):
                        last[kind] = text
                        yield _event(kind, text)
                yield ""
                await asyncio.sleep(poll)

        return _stream(request, events())

    async def tuning_events(request: Request) -> Response:
        name = request.path_params["name"]
        await tuning_or_404(name)

        async def events() -> AsyncIterator[str]:
            last, reset = None, True
            seen: dict[str, list[float]] = {}
            while True:
                detail = await call(tuning.tuning_detail, store, name)
                series = detail.pop("series")
                text = json.dumps(detail)
                if text != last:
                    last = text
                    yield _event("tuning", text)
                changed = {trial: values for trial, values in series.items() if seen.get(trial) != values}
                if changed or reset:
                    yield _event("series", json.dumps({"series": changed, "reset": reset}))
                    seen.update(changed)
                reset = False
                yield ""
                await asyncio.sleep(poll)

        return _stream(request, events())

    async def job_events(request: Request) -> Response:
        name = request.path_params["name"]
        first = await job_or_404(name)
        follower = _follower(store, first, request) if request.query_params.get("logs") != "0" else None

        async def events() -> AsyncIterator[str]:
            if follower is not None:
                yield _event("log", json.dumps({"lines": await call(follower.tail, TAIL_LINES), "reset": True}))
            after, since, last = 0, 0.0, None
            reset = True
            while True:
                job = await call(data.job_detail, store, name)
                text = json.dumps(job)
                if text != last:
                    last = text
                    yield _event("job", text)
                rows, after = await call(data.metric_rows, store, name, after)
                if rows or reset:
                    yield _event("metrics", json.dumps({"rows": rows, "reset": reset}))
                system, since = await call(data.system_rows, store, name, since)
                if system or reset:
                    yield _event("system", json.dumps({"rows": system, "reset": reset}))
                lines = await call(follower.new) if follower is not None else []
                if lines:
                    yield _event("log", json.dumps({"lines": lines, "reset": False}))
                reset = False
                yield ""
                await asyncio.sleep(poll)

        return _stream(request, events())

    routes = [
        Route("/", page("index.html")),
        Route("/jobs/{name}", page("job.html")),
        Route("/tuning/{name}", page("tuning.html")),
        Route("/compare", page("compare.html")),
        Route("/api/jobs", api_jobs),
        Route("/api/events", list_events),
        Route("/api/jobs/{name}", api_job),
        Route("/api/jobs/{name}/metrics", api_metrics),
        Route("/api/jobs/{name}/system", api_system),
        Route("/api/jobs/{name}/logs", api_logs),
        Route("/api/jobs/{name}/events", job_events),
        Route("/api/jobs/{name}/download/{key}", api_download),
        Route("/api/tuning", api_tuning_jobs),
        Route("/api/tuning/{name}", api_tuning_job),
        Route("/api/tuning/{name}/events", tuning_events),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={
        _NotFound: _not_found, _BadRequest: _bad_request, StorageError: _store_problem})
    return Access(app, token)


class _NotFound(Exception):
    pass


class _BadRequest(Exception):
    pass


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=404)


async def _bad_request(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=400)


async def _store_problem(request: Request, exc: Exception) -> Response:
    """The jobs home cannot be read (a damaged index, a full disk): the message names the file and the fix."""
    return JSONResponse({"error": str(exc)}, status_code=503)


def _number(request: Request, key: str, default: N, kind: type[N]) -> N:
    """The query parameter ``key`` as an ``int`` or ``float`` (``default`` when absent); anything else is a 400."""
    value = request.query_params.get(key)
    if value is None or value == "":
        return default
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise _BadRequest(f"{key} must be {what}, not {value!r}") from None


def _follower(store: JobStore, job: dict[str, Any], request: Request) -> LogFollower:
    host = request.query_params.get("host") or None
    rank = request.query_params.get("rank")
    sources = log_sources(store.job_dir(job["name"]), job["host_names"])
    if host is not None and host not in sources:
        raise _BadRequest(f"job {job['name']} has no log {host!r}; its logs are {', '.join(sources)}")
    return LogFollower(sources, host, None if rank in (None, "") else _number(request, "rank", 0, int))


async def _problems_said(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``; a store that cannot be read ends the stream with a ``problem`` event naming why (the browser
    shows it and reconnects, which starts over)."""
    try:
        async for item in events:
            yield item
    except StorageError as exc:
        yield _event("problem", json.dumps({"error": str(exc)}))


def _event(kind: str, payload: str) -> str:
    return f"event: {kind}\ndata: {payload}\n\n"


def _stream(request: Request, events: AsyncIterator[str]) -> Response:
    """``events`` as server-sent events until the browser goes away; an empty item is a moment to check that (and,
    when the stream has been quiet for :data:`KEEPALIVE` seconds, to send a comment)."""

    async def body() -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        since = loop.time()
        try:
            async for item in _problems_said(events):
                if await request.is_disconnected():
                    return
                if item:
                    since = loop.time()
                    yield item
                elif loop.time() - since >= KEEPALIVE:
                    since = loop.time()
                    yield ": keep-alive\n\n"
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(body(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})
