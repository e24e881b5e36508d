"""``hora dashboard``: a local web application that shows ``hora job`` jobs as they run (docs/dashboard.md).

The job list, each job's status history, failure reason, live log, metric and system-metric charts, artifacts,
timeline and autotune log, and several jobs' metrics overlaid. It reads the jobs home (:class:`hora.jobs.JobStore`)
and the job directories and writes nothing of its own. It needs the ``dashboard`` extra (Starlette and uvicorn);
the chart library (uPlot, MIT) ships inside the package.
"""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra() -> str | None:
    """Why the dashboard cannot start here (its extra is not installed), or None."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return (f"hora dashboard needs the dashboard extra ({exc.name} is missing): "
                "pip install -c constraints.txt -e '.[dashboard]' in hora's checkout")
    return None
