"""The engine's control connections: JSON frames between the workers and the coordinator on rank 0, used by full
negotiation rounds only (cached collectives never touch them).

    worker -> coordinator   ["req", [request, ...]]
    coordinator -> worker   ["resp", [[response, ...], fatal_message_or_null]]
    coordinator -> worker   ["abort", [message]]     rank 0 failed: fail everything with PeerLostError
"""

from __future__ import annotations

import builtins
import contextlib
import socket
from collections.abc import Callable
from typing import Any

from hora._engine.messages import decode, encode
from hora._engine.negotiation import format_ranks
from hora._wire import recv_frame, send_frame
from hora.errors import CollectiveTimeoutError, HoraError, PeerLostError

__all__ = ["ControlLinks", "leaving_message"]


class ControlLinks:
    """Rank 0 holds a socket to every worker; a worker holds one to rank 0. Rank 0's receives time out after
    ``timeout`` seconds, a worker's after twice that: when one worker is stuck, the coordinator is the one to time
    out on it and its abort names that rank to every other worker, instead of each of them timing out on the
    coordinator at the same moment and naming rank 0 (which was only waiting). A peer that closes its connection is
    reported as having died or left."""

    def __init__(
        self,
        rank: int,
        sockets: dict[int, socket.socket],
        timeout: float,
        max_frame_bytes: int,
        describe: dict[int, str],
    ) -> None:
        self.rank = rank
        self._socks = dict(sockets)
        self._timeout = timeout if rank == 0 else 2 * timeout
        self._max = max_frame_bytes
        self._describe = describe
        for sock in self._socks.values():
            sock.settimeout(self._timeout)

    @property
    def peers(self) -> list[int]:
        return sorted(self._socks)

    def who(self, peer: int) -> str:
        return self._describe.get(peer, f"rank {peer}")

    def send(self, peer: int, kind: str, payload: list[Any]) -> None:
        send_frame(self._socks[peer], encode(kind, payload))

    def send_all(self, kind: str, payload: list[Any]) -> None:
        message = encode(kind, payload)
        for peer in self.peers:
            send_frame(self._socks[peer], message)

    def recv(self, peer: int, what: str) -> tuple[str, list[Any]]:
        """One message from ``peer``; ``what`` says what was awaited, for the errors."""
        try:
            return decode(recv_frame(self._socks[peer], self._max, self.who(peer)))
        except builtins.TimeoutError:
            raise CollectiveTimeoutError(
                f"rank {self.rank} waited {self._timeout:g}s for {what} from {self.who(peer)} during "
                "negotiation; the peer is alive but stuck (raise HORA_OP_TIMEOUT_SECONDS if it is just slow)"
            ) from None
        except (HoraError, OSError, ValueError) as exc:
            self.drop(peer)
            raise PeerLostError(
                f"{self.who(peer)} closed its control connection during negotiation: the process died or left "
                f"without hvd.shutdown() ({exc})"
            ) from None

    def abort_all(self, message: str) -> None:
        """Tell every worker that the coordinator failed (best effort) and close every connection."""
        for peer in self.peers:
            with contextlib.suppress(OSError):
                self.send(peer, "abort", [message])
            self.drop(peer)

    def drop(self, peer: int) -> None:
        sock = self._socks.pop(peer, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for peer in self.peers:
            self.drop(peer)


def leaving_message(others: dict[int, int], who: Callable[[int], str]) -> str:
    """Why the ranks ``others`` (rank -> BYE code: -1 shutdown(), -2 the script ended, -3 it ended with an uncaught
    exception) can no longer take part in a collective; empty when there are none."""
    if not others:
        return ""
    if all(code == -1 for code in others.values()):
        return (
            f"{format_ranks(others)} called shutdown(); no collective can run after a rank shut down (call "
            "shutdown() on every rank)"
        )
    parts = []
    for r, code in sorted(others.items()):
        how = {-2: "ended", -3: "ended with an uncaught exception"}.get(code, "called shutdown()")
        parts.append(f"the script of {who(r)} {how}")
    whose = "that rank's" if len(others) == 1 else "those ranks'"
    return (
        f"{'; '.join(parts)} while this rank was still in a collective with it; the root cause is in {whose} output"
    )
