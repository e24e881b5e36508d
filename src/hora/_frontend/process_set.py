"""Process sets as the API sees them (Horovod's ``horovod/common/process_sets.py``): a :class:`ProcessSet` names a
group of ranks; :func:`group_of` finds the engine group a collective on it runs in."""

from __future__ import annotations

import numbers
from collections.abc import Iterable

from hora._runtime.context import current, is_initialized
from hora._runtime.group import Group
from hora.errors import ConfigError

__all__ = ["ProcessSet", "global_process_set", "group_of", "root_index"]


class ProcessSet:
    """A group of ranks that collectives can run within (``process_set=``), negotiated independently of the other
    sets. Create with ``ProcessSet([0, 2])`` and register it with ``add_process_set`` (every rank calls it) or pass
    it to ``init(process_sets=[...])``. The ranks may be any iterable of ints (sorted, as in Horovod). As in Horovod,
    ``size()`` and ``rank()`` are None until the set is registered (``process_set_id`` set), ``included()`` answers
    from the ranks alone; ``rank()`` is the index of this rank within the set."""

    def __init__(self, ranks_or_comm: Iterable[int]) -> None:
        try:
            given = list(ranks_or_comm)  # any iterable, sorted (Horovod's is_iterable + sorted)
        except TypeError:
            raise ValueError(
                f"ProcessSet should be initialized with a list of process ranks; got {type(ranks_or_comm).__name__} "
                f"{ranks_or_comm!r} (hora does not use MPI, so a communicator cannot define a set: pass its ranks)"
            ) from None
        bad = [r for r in given if not isinstance(r, numbers.Integral)]
        if bad:
            raise ValueError(
                f"ProcessSet should be initialized with a list of process ranks; got {given!r}, where "
                f"{bad[0]!r} is a {type(bad[0]).__name__}, not an int"
            )
        self.ranks: list[int] = sorted({int(r) for r in given})
        self.process_set_id: int | None = None

    def _members(self) -> list[int]:
        return self.ranks

    def size(self) -> int | None:
        return None if self.process_set_id is None else len(self._members())

    def rank(self) -> int | None:
        """This rank's index within the set; ValueError on a rank outside it (check ``included()`` first)."""
        if self.process_set_id is None:
            return None
        me = current().rank
        members = self._members()
        if me not in members:
            raise ValueError(f"rank {me} is not a member of {self!r}")
        return members.index(me)

    def included(self) -> bool:
        return current().rank in self._members()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and (self._members(), self.process_set_id) == (
            other._members(),
            other.process_set_id,
        )

    def __hash__(self) -> int:
        return hash((tuple(self._members()), self.process_set_id))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self._members()})"


class _GlobalProcessSet(ProcessSet):
    """Every rank (``process_set_id`` 0); its ``ranks`` follow the running job."""

    def __init__(self) -> None:
        self.process_set_id = 0

    @property
    def ranks(self) -> list[int]:  # type: ignore[override]
        return self._members()

    def _members(self) -> list[int]:
        return list(range(current().size)) if is_initialized() else []


global_process_set: ProcessSet = _GlobalProcessSet()


def group_of(process_set: ProcessSet | None) -> Group:
    """The engine group collectives on ``process_set`` run in (None or the global set: every rank)."""
    ctx = current()
    if process_set is None or process_set.process_set_id == 0:
        return ctx.group
    set_id = process_set.process_set_id
    if set_id is None:
        raise ValueError(f"{process_set!r} has not been added: call hvd.add_process_set(...) on every rank first")
    sub = ctx.sets.get(set_id)
    if sub is None:
        raise ConfigError(
            f"rank {ctx.rank} is not a member of process set {set_id} (or the set was removed): only its member "
            "ranks may run collectives on it"
        )
    return sub


def root_index(process_set: ProcessSet | None, root_rank: int) -> int:
    """A root rank (a global rank, as in Horovod) as its index in ``process_set``."""
    if process_set is None or process_set.process_set_id == 0:
        return int(root_rank)
    if root_rank not in process_set.ranks:
        raise ValueError(f"root_rank {root_rank} is not in {process_set!r}")
    return process_set.ranks.index(root_rank)
