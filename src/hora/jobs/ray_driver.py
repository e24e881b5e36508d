"""Connecting a hora job process (a job's supervisor with hosts on a Ray cluster, a tuning job's supervisor with
trials there, ``hora job clean --ray``) to a Ray cluster as a driver, once for both.

``ray.init`` installs its own SIGTERM handler, which would end the supervisor without archiving or ending its
trials, and points ``PYTHONBREAKPOINT`` at Ray's debugger, which the job's processes would inherit: both are put
back as they were. A process that is a driver already keeps its connection (and must not shut it down).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from hora.config.process_env import restore_process_env
from hora.config.variables import environment
from hora.errors import ConfigError, HoraError, HostError

__all__ = ["connect", "last_line"]


def last_line(exc: BaseException) -> str:
    """The last non-empty line of what ``exc`` says (Ray's errors end with the reason), else its type's name."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def connect(address: str, namespace: str, needs: str, named: str, fix: str,
            error: type[HoraError] = HostError) -> tuple[Any, bool]:
    """``ray`` connected to the cluster at ``address`` in ``namespace``, and whether this call connected it.

    ``needs``: what needs Ray, for the message when it is not installed (ConfigError); ``named``: how the message
    names the address, ``fix``: the end of its advice, ``error``: its type, when the cluster cannot be reached.
    """
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{needs} needs Ray: pip install -c constraints.txt -e '.[ray]' in hora's checkout") from None
    if ray.is_initialized():
        return ray, False
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    breakpoint_hook = environment().get("PYTHONBREAKPOINT")
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, namespace=namespace)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise error(f"cannot connect to the Ray cluster at {named}: {last_line(exc)}; start one (ray start --head) "
                    f"or name a running one{fix}") from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        restore_process_env({"PYTHONBREAKPOINT": breakpoint_hook})
    return ray, True
