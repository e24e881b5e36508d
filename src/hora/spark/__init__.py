"""hora on Spark: :func:`run` runs a function on hora ranks that are the tasks of one Spark barrier stage
(Horovod's ``horovod.spark.run``). Needs the ``spark`` extra (``pip install -c constraints.txt -e '.[spark]'`` in
hora's checkout) and Java 17. See docs/engines.md.
"""

from __future__ import annotations

from hora.spark.runner import run

__all__ = ["run"]
