"""hora on Spark: :func:`run` runs a function on hora ranks that are the tasks of one Spark barrier stage
(Horovod's ``horovod.spark.run``); :func:`run_elastic` runs an elastic function on workers in Spark tasks that come
and go with their executors (Horovod's ``horovod.spark.run_elastic``). Needs the ``spark`` extra (``pip install -c
constraints.txt -e '.[spark]'`` in hora's checkout) and Java 17. See docs/engines.md.
"""

from __future__ import annotations

from hora.spark.elastic import run_elastic
from hora.spark.runner import run

__all__ = ["run", "run_elastic"]
