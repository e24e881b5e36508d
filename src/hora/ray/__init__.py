"""hora on Ray: :class:`RayExecutor` runs a function on hora ranks that are Ray actors (Horovod's
``horovod.ray.RayExecutor`` calls). Needs the ``ray`` extra (``pip install -c constraints.txt -e '.[ray]'`` in hora's
checkout). See docs/engines.md.
"""

from __future__ import annotations

from hora.ray.elastic import ElasticRayExecutor, ElasticRaySettings, RayHostDiscovery
from hora.ray.executor import RayExecutor, RaySettings
from hora.ray.worker import WorkerState

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayExecutor", "RayHostDiscovery", "RaySettings", "WorkerState"]
