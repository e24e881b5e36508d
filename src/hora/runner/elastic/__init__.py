"""Elastic ``hora run``: workers may fail, leave and join while the job goes on (Horovod's elastic launcher).
:mod:`.discovery` finds the hosts, :mod:`.driver` forms the rounds, :mod:`.launch` runs the processes; the ranks'
side is :mod:`hora._runtime.elastic_join` and ``hvd.elastic``. See docs/elastic.md."""

from hora.runner.elastic.launch import ElasticSpec, launch_elastic

__all__ = ["ElasticSpec", "launch_elastic"]
