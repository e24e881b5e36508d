"""The exception hierarchy of hora.

Every error hora raises on purpose derives from :class:`HoraError`. Messages say what was given, what is allowed and
how to fix it; errors about collectives name the operation, the tensor and the ranks involved.
"""

from __future__ import annotations

import builtins
from typing import Any

__all__ = [
    "AuthenticationError",
    "ChannelError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "ConfigError",
    "HoraError",
    "HoraInternalError",
    "HorovodInternalError",
    "HostError",
    "HostStartError",
    "HostsUpdatedInterrupt",
    "MismatchError",
    "NotInitializedError",
    "PeerLostError",
    "ProtocolError",
    "RecordError",
    "RendezvousError",
    "RunError",
    "ShutdownError",
    "SpecError",
    "StallError",
    "StorageError",
    "TimeoutError",
    "UnexpectedStatusException",
    "UnsupportedError",
]


class HoraError(RuntimeError):
    """Base class of every error raised by hora."""


class ConfigError(HoraError, ValueError):
    """A setting, environment variable or argument is invalid or inconsistent."""


class StorageError(HoraError):
    """Reading or writing job data failed: a missing path, bucket or prefix, refused credentials, no endpoint."""


class ChannelError(StorageError):
    """A training job's data channel could not be staged or streamed; the message names the channel."""


class RecordError(HoraError, ValueError):
    """A record stream is corrupt or truncated (a TFRecord CRC mismatch); the message names the byte offset."""


class SpecError(ConfigError):
    """A job spec is invalid; ``problems`` lists every problem found (the message shows them all)."""

    def __init__(self, problems: list[str], source: str = "the job spec") -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source} has {len(problems)} problem{'s' if len(problems) > 1 else ''}:\n{lines}")


class UnsupportedError(HoraError, ValueError, NotImplementedError):
    """An argument combination hora does not support (an unsupported dtype, op, strategy, ...). It is a ValueError
    (Horovod's PyTorch tests expect one for bad arguments) and a NotImplementedError (Horovod's TensorFlow tests
    expect one for what is not implemented, such as Adasum), so one type answers both (docs/api.md)."""


class NotInitializedError(HoraError, ValueError):
    """A hora function that needs :func:`init` was called before it (or after :func:`shutdown`)."""


class RendezvousError(HoraError):
    """Ranks could not find each other: a rank never arrived, or the rendezvous server is unreachable."""


class AuthenticationError(HoraError):
    """A peer failed the challenge-response handshake (wrong secret, different job, or not a hora peer)."""


class ProtocolError(HoraError):
    """A peer sent bytes that break hora's wire protocol (bad magic, oversized frame, malformed message)."""


class HorovodInternalError(HoraError):
    """A collective could not complete: a peer was lost or stuck, a wait timed out, hora was shut down under it, the
    ranks disagreed (Horovod's name, ``hvd.HorovodInternalError`` in every adapter). Inside
    ``hvd.elastic.run`` it starts a reset: the state is restored to its last commit and training goes on with the
    ranks that are left (a :class:`MismatchError`, a bug in the script, is re-raised instead)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added to or removed from an elastic job (Horovod's name and constructor): raised on every rank at
    the same ``state.commit()``; ``hvd.elastic.run`` then resets without restoring the state, and without syncing
    it again when ``skip_sync`` (only hosts were removed: every rank left already has it)."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__(
            "the job's hosts changed" + (" (hosts were removed)" if skip_sync else " (hosts were added)")
        )
        self.skip_sync = skip_sync


class CollectiveError(HorovodInternalError):
    """A collective operation failed."""


class MismatchError(CollectiveError, ValueError):
    """Ranks submitted the same tensor name with different dtype, shape, op, root or scale factors."""


class PeerLostError(CollectiveError):
    """A peer process died or closed its connections while this rank depended on it."""


class StallError(CollectiveError):
    """A collective waited for missing ranks longer than the configured shutdown time."""


class ShutdownError(CollectiveError):
    """The operation was pending when hora was shut down on this or another rank."""


class TimeoutError(HoraError, builtins.TimeoutError):
    """A blocking operation did not finish within its time limit."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective (or a parameter-server operation) made no progress with a peer within its time limit: the peer
    is stuck, or the link is down."""


class HoraInternalError(HoraError):
    """A bug in hora: please report it with the message and the log."""


class HostError(HoraError):
    """A host of a multi-host job cannot be used: unreachable, refusing SSH, rejecting the key, or not answering."""


class HostStartError(HoraError):
    """A host of a training job failed, not a rank: the master could not start hora run or died, or another host
    never came up."""


class RunError(HoraError):
    """A job started by :func:`hora.runner.run` failed; ``result`` (a :class:`hora.runner.RunResult`: errors.py is
    a leaf and does not import the runner) holds the per-rank outcome and the root cause."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


class UnexpectedStatusException(HoraError, ValueError):
    """A training job waited for with ``Estimator.fit()`` ended Failed (the SageMaker SDK's exception of the same
    name and attributes): ``actual_status`` is the job's status, ``allowed_statuses`` what would not have raised."""

    def __init__(self, message: str, allowed_statuses: list[str], actual_status: str) -> None:
        super().__init__(message)
        self.allowed_statuses = allowed_statuses
        self.actual_status = actual_status
