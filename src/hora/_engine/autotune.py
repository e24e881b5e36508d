"""Autotune (Horovod's ``HOROVOD_AUTOTUNE``): rank 0 scores the engine's settings in bytes/s over samples of the
first steps and tries new ones by Bayesian optimisation (``bayes.py``) until it keeps the best.

What is tuned: the fusion threshold (0-64 MiB), the cycle time (0-25 ms), the response cache on/off (when the cache
has capacity) and hierarchical allreduce/allgather on/off (only on a job spanning several hosts, whose transport is
hierarchical; elsewhere they have no effect and stay fixed).

A *sample* ends when some collective has completed ``steps_per_sample`` times under its name since the sample
began (Horovod's rule: a step is one completion of each gradient); its score is the bytes of every collective
completed in it divided by its duration. The first ``warmup_samples`` samples run the starting settings and are
discarded; then ``max_samples`` points are scored, the first being the starting settings; the best is kept.

The engine carries rank 0's decision to every rank (see :class:`~hora._engine.engine.Engine`): rank 0 asks for a
full negotiation round in the next cycle and sends the point with that round's responses; every rank applies it
after executing that cycle, so all switch between the same two cycles.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from typing import IO, Any

import numpy as np

from hora._engine.bayes import BayesianSearch, require_gaussian_process
from hora._engine.fusion import nbytes
from hora._engine.messages import Response
from hora._transport.hierarchical import HierarchicalTransport

__all__ = ["CSV_HEADER", "Autotuner", "TuneLink", "TunedPoint", "hierarchical_of", "make_tuner"]

log = logging.getLogger("hora")

#: Horovod's autotune log columns; the fusion threshold in bytes (HOROVOD_FUSION_THRESHOLD's unit), score in bytes/s.
CSV_HEADER = "hierarchical_allreduce,hierarchical_allgather,cache_enabled,cycle_time_ms,tensor_fusion_threshold,score"
FUSION_MAX = 64 << 20
CYCLE_MAX_MS = 25.0


@dataclass(frozen=True)
class TunedPoint:
    """One setting of every tuned knob."""

    fusion_threshold: int
    cycle_time_ms: float
    cache_enabled: bool
    hierarchical_allreduce: bool
    hierarchical_allgather: bool

    def to_wire(self) -> list[Any]:
        return list(astuple(self))

    @classmethod
    def from_wire(cls, wire: list[Any]) -> TunedPoint:
        f, c, cache, ha, hg = wire
        return cls(int(f), float(c), bool(cache), bool(ha), bool(hg))

    def csv(self, score: float) -> str:
        return (
            f"{int(self.hierarchical_allreduce)},{int(self.hierarchical_allgather)},{int(self.cache_enabled)},"
            f"{self.cycle_time_ms:.3f},{self.fusion_threshold},{score:.1f}"
        )


class Autotuner:
    """Rank 0's tuner. The engine calls :meth:`record` with what each cycle completed, :meth:`end_cycle` after
    each cycle, sends :attr:`proposal` to every rank when it is set, and calls :meth:`applied` when it took
    effect."""

    def __init__(
        self,
        start: TunedPoint,
        warmup_samples: int,
        steps_per_sample: int,
        max_samples: int,
        noise: float,
        log_path: str,
        tune_cache: bool,
        tune_hierarchical: bool,
    ) -> None:
        self.start, self.point = start, start
        self._warmup = warmup_samples
        self._steps = steps_per_sample
        self._max = max_samples
        self._tune_cache, self._tune_hier = tune_cache, tune_hierarchical
        self.tunes_hierarchical = tune_hierarchical
        self._search = BayesianSearch(2, int(tune_cache) + 2 * int(tune_hierarchical), noise)
        self._log: IO[str] | None = None
        if log_path:
            try:
                self._log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - open for the whole tuning
                self._log.write(CSV_HEADER + "\n")
                self._log.flush()
            except OSError as exc:  # only rank 0 writes: failing its init alone would strand the other ranks
                log.warning("hora autotune cannot write its log %s (%s); tuning without a log", log_path, exc)
                self._log = None
        self.active = True
        self.proposal: TunedPoint | None = None
        # when the current sample began: the end of a cycle (None: at the end of the first cycle that completes
        # something, which is not counted; every sample then runs from one cycle's end to another's)
        self._began: float | None = None
        self._bytes = 0
        self._counts: dict[str, int] = {}

    # -- engine hooks ------------------------------------------------------------------------------------------
    def record(self, responses: Iterable[Response], now: float) -> None:
        """Collectives completed in this cycle (on rank 0; every rank completes the same ones)."""
        if self.proposal is not None:
            return  # between a decision and its switch nothing is scored
        if self._began is None:
            self._began = now
            return
        for resp in responses:
            self._bytes += nbytes(resp)
            name = resp.request.name
            self._counts[name] = self._counts.get(name, 0) + 1

    def end_cycle(self, now: float) -> None:
        if not self.active or self.proposal is not None or self._began is None:
            return
        if not self._counts or max(self._counts.values()) < self._steps:
            return
        duration = max(now - self._began, 1e-9)
        self._sampled(self._bytes / duration, now)

    def applied(self, point: TunedPoint, now: float) -> None:
        """``point`` took effect on every rank at the end of this cycle: the next sample starts now."""
        self.point, self.proposal = point, None
        self._began, self._bytes, self._counts = now, 0, {}

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- the search ---------------------------------------------------------------------------------------------
    def _sampled(self, score: float, now: float) -> None:
        if self._warmup > 0:
            self._warmup -= 1
            log.debug("autotune warm-up sample: %.3g bytes/s", score)
            self._began, self._bytes, self._counts = now, 0, {}  # the next sample starts where this one ended
            return
        self._search.tell(self._encode(self.point), score)
        if self._log is not None:
            self._log.write(self.point.csv(score) + "\n")
            self._log.flush()
        log.debug("autotune sample %d: %s -> %.3g bytes/s", len(self._search.ys), self.point, score)
        if len(self._search.ys) >= self._max:
            x, best = self._search.best()
            final = self._decode(x)
            log.info("autotune chose %s (%.3g bytes/s)", final, best)
            if self._log is not None:
                self._log.write(final.csv(best) + "\n")
            self.close()
            self.active = False
            self.proposal = final if final != self.point else None
            return
        self.proposal = self._decode(self._search.ask())

    def _encode(self, p: TunedPoint) -> np.ndarray:
        x = [p.fusion_threshold / FUSION_MAX, p.cycle_time_ms / CYCLE_MAX_MS]
        if self._tune_cache:
            x.append(float(p.cache_enabled))
        if self._tune_hier:
            x += [float(p.hierarchical_allreduce), float(p.hierarchical_allgather)]
        return np.clip(np.asarray(x, float), 0.0, 1.0)

    def _decode(self, x: np.ndarray) -> TunedPoint:
        fusion = round(float(x[0]) * FUSION_MAX / 4096) * 4096  # whole pages: nicer numbers in the log
        cycle = round(float(x[1]) * CYCLE_MAX_MS, 3)
        i = 2
        cache = self.start.cache_enabled
        if self._tune_cache:
            cache, i = bool(x[i] > 0.5), i + 1
        ha, hg = self.start.hierarchical_allreduce, self.start.hierarchical_allgather
        if self._tune_hier:
            ha, hg = bool(x[i] > 0.5), bool(x[i + 1] > 0.5)
        return TunedPoint(fusion, cycle, cache, ha, hg)


def make_tuner(rank: int, settings: Any, transport: Any) -> Autotuner | None:
    """Rank 0's tuner when ``settings.autotune`` (None elsewhere). Every rank checks that scikit-learn is there, so
    a missing extra fails init() the same way everywhere rather than only on rank 0."""
    if not settings.autotune:
        return None
    require_gaussian_process()
    if rank != 0:
        return None
    hier = hierarchical_of(transport)
    start = TunedPoint(
        settings.fusion_threshold, settings.cycle_time * 1000.0, settings.cache_capacity > 0, *(hier or (False, False))
    )
    return Autotuner(
        start,
        settings.autotune_warmup_samples,
        settings.autotune_steps_per_sample,
        settings.autotune_max_samples,
        settings.autotune_noise,
        settings.autotune_log,
        settings.cache_capacity > 0,
        hier is not None,
    )


def hierarchical_of(transport: Any) -> tuple[bool, bool] | None:
    """(allreduce, allgather) of a hierarchical transport; None for one whose algorithm does not depend on them."""
    if isinstance(transport, HierarchicalTransport):
        return transport.hierarchical_allreduce, transport.hierarchical_allgather
    return None


class TuneLink:
    """An engine's side of autotune, on every rank: rank 0's tuner (if any), the point a full negotiation round
    carries, and :attr:`history`, the (cycle, point) of every switch (the same list on every rank)."""

    def __init__(self, rank: int, settings: Any, transport: Any) -> None:
        self.tuner = make_tuner(rank, settings, transport)
        self.history: list[tuple[int, TunedPoint]] = []
        self._carried: list[Any] | None = None

    def wants_round(self) -> bool:
        """Rank 0 has a point to send: the cycle must run a full round, which carries it."""
        return self.tuner is not None and self.tuner.proposal is not None

    def outgoing(self) -> list[Any] | None:
        """On rank 0, in a full round: the point to send with the responses (None: no switch)."""
        proposal = self.tuner.proposal if self.tuner is not None else None
        self._carried = proposal.to_wire() if proposal is not None else None
        return self._carried

    def incoming(self, wire: list[Any] | None) -> None:
        """On the other ranks, in a full round: what rank 0 sent."""
        self._carried = wire

    def record(self, responses: Iterable[Response]) -> None:
        if self.tuner is not None and self.tuner.active:
            self.tuner.record(responses, time.monotonic())

    def after_cycle(self, cycle: int, settings: Any, transport: Any) -> TunedPoint | None:
        """At the end of every cycle: switch ``settings`` and ``transport`` to the point this cycle's full round
        carried (returned, for the engine to switch the cache), and let rank 0's tuner close a sample."""
        point = None
        if self._carried is not None:
            point, self._carried = TunedPoint.from_wire(self._carried), None
            settings.fusion_threshold, settings.cycle_time = point.fusion_threshold, point.cycle_time_ms / 1000.0
            if isinstance(transport, HierarchicalTransport):
                transport.hierarchical_allreduce = point.hierarchical_allreduce
                transport.hierarchical_allgather = point.hierarchical_allgather
            self.history.append((cycle, point))
            if self.tuner is not None:
                self.tuner.applied(point, time.monotonic())
        if self.tuner is not None and self.tuner.active:
            self.tuner.end_cycle(time.monotonic())
        return point

    def close(self) -> None:
        if self.tuner is not None:
            self.tuner.close()
