"""hora: distributed training with Horovod's API.

``import hora.numpy as hvd`` (or, with their extras, ``hora.torch``...) gives the collectives; ``hora run`` starts
the processes. This package itself only exports the version, the lifecycle and the errors, and imports no
framework.
"""

from hora import errors
from hora._runtime.context import init, is_initialized, shutdown
from hora.config import Config

__version__ = "0.1.0"

__all__ = ["Config", "__version__", "errors", "init", "is_initialized", "shutdown"]
