"""hora for numpy arrays, with Horovod's names: ``import hora.numpy as hvd``.

The implementation lives in :mod:`hora._frontend`, which the other framework adapters share; this module is its
public face for numpy arrays (``tests/test_public_api.py`` pins the names).
"""

from hora import _frontend
from hora._engine.handle import Handle as Handle  # re-exported
from hora._frontend import *  # noqa: F403

__all__ = sorted([*_frontend.__all__, "Handle"])
