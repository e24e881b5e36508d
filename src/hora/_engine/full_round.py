"""The wire side of a full negotiation round: every worker sends its new requests to rank 0 over its control
connection, rank 0's :class:`~hora._engine.negotiation.Coordinator` decides, and every rank gets the same responses
(with the stall verdict and the autotune point the round carries)."""

from __future__ import annotations

from typing import Any

from hora._engine.control import ControlLinks
from hora._engine.messages import Kind, Request, Response
from hora._engine.negotiation import Coordinator
from hora._engine.timeline import Timeline, tensor_names
from hora.errors import HoraInternalError, PeerLostError

__all__ = ["negotiate"]


def negotiate(
    control: ControlLinks,
    coordinator: Coordinator | None,
    requests: list[Request],
    waited: list[float],
    stall_fatal: str | None,
    autotune: Any,
    timeline: Timeline | None,
) -> tuple[list[Response], str | None]:
    """This rank's ``requests`` (each waited ``waited`` seconds so far) in, every rank's responses and the stall
    verdict (``stall_fatal`` on rank 0, which has the coordinator) out."""
    if coordinator is not None:
        _submit(coordinator, 0, requests, waited, timeline)
        for peer in control.peers:
            kind, payload = control.recv(peer, "its requests")
            if kind != "req":
                raise HoraInternalError(f"expected requests from {control.who(peer)}, got {kind!r}")
            ages = [float(w[10]) if len(w) > 10 else 0.0 for w in payload]
            _submit(coordinator, peer, [Request.from_wire(w) for w in payload], ages, timeline)
        responses = coordinator.take()
        control.send_all("resp", [[r.to_wire() for r in responses], stall_fatal, autotune.outgoing()])
        if timeline is not None:
            for r in responses:
                for n in tensor_names(r.request):
                    timeline.negotiate_end(n)
        return responses, stall_fatal
    control.send(0, "req", [[*r.to_wire(), round(w, 3)] for r, w in zip(requests, waited)])
    kind, payload = control.recv(0, "the negotiated responses")
    if kind == "abort":
        raise PeerLostError(str(payload[0]))
    if kind != "resp" or len(payload) != 3:
        raise HoraInternalError(f"expected responses from the coordinator, got {kind!r}")
    autotune.incoming(payload[2])
    return [Response.from_wire(w) for w in payload[0]], payload[1]


def _submit(
    coordinator: Coordinator, peer: int, requests: list[Request], waited: list[float], timeline: Timeline | None
) -> None:
    if timeline is not None:
        for r in requests:
            for n in tensor_names(r):
                if r.kind is not Kind.JOIN:  # opens the phase unless open (it may start mid-negotiation)
                    timeline.negotiate_start(n, r.kind.value)
                timeline.negotiate_rank_ready(n, peer)
    coordinator.submit(peer, requests, waited)
