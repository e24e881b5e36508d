"""Hierarchical transport for multi-host jobs: shared memory within a host, TCP rings across hosts.

Ranks are grouped by the host they reported; ``hosts`` lists each host's global ranks in local-rank order, hosts
in order of their first rank. Let ``L`` be the *smallest* number of ranks on any host. The buffer of a collective
is split into ``L`` even slices, and local rank ``i < L`` of every host carries slice ``i`` across the network in
**lane** ``i``: a TCP ring among the ranks with local rank ``i``, one per host (every host has such a rank, since
every host has at least ``L`` ranks). Ranks with local rank ``>= L`` (only on hosts with more ranks than the
smallest) take no part in the cross-host step; they contribute and receive through shared memory. With equal
slot counts every rank carries a slice, as in Horovod's hierarchical allreduce; with unequal ones no host's link
carries more than ``1/L`` of the data per lane, and every lane has a member on every host, so the rings need no
leader and no second pass.

- **allreduce**: shm reduce-scatter (local rank ``i`` receives slice ``i`` reduced over its host; ranks ``>= L``
  receive nothing) → lane ``i`` ring allreduce of slice ``i`` → shm allgather of the slices.
- **allgather**: shm allgather of the host's contributions (the host *block*, in local-rank order) → lane ``i``
  ring allgather of part ``i`` of every host's block → shm allgather of what the lanes received → every rank
  reorders the blocks into global rank order.
- **broadcast**: shm broadcast on the root's host → lane ``i`` ring broadcast of slice ``i`` from the root's host
  → shm allgather of the slices on every other host.

Everything else (reducescatter, alltoall) and whichever of the above a setting turns off runs on the flat TCP
ring over all ranks (``flat``), which shares its sockets with the lanes (calls are sequential on the engine
thread, and each finishes its sends before it returns).

Reduction order differs from the flat ring, so float results may differ from it in the last bits; integer
results are identical. float16/bfloat16 sums accumulate in float32 within a host of more than two ranks (as the
shared-memory transport does) and in the tensor's dtype across hosts (as the TCP ring does).
"""

from __future__ import annotations

import numpy as np

from hora._dtypes import even_counts, offsets
from hora._transport.base import Transport
from hora._transport.tcp import TcpTransport

__all__ = ["HierarchicalTransport"]


class HierarchicalTransport(Transport):
    """A per-host transport (``local``: shared memory, or a :class:`SelfTransport` for a host of one rank), this rank's
    lane (``lane``: a TCP ring among the hosts, ``None`` for a rank with local rank ``>= L``) and the flat TCP
    ring over every rank (``flat``)."""

    def __init__(
        self,
        rank: int,
        size: int,
        hosts: list[list[int]],
        local: Transport,
        lane: Transport | None,
        flat: TcpTransport,
        allreduce: bool,
        allgather: bool,
    ) -> None:
        self.rank, self.size = rank, size
        self._hosts = hosts
        self._host = next(h for h, rs in enumerate(hosts) if rank in rs)
        self._local_rank = hosts[self._host].index(rank)
        self._lanes = min(len(rs) for rs in hosts)
        if (lane is None) != (self._local_rank >= self._lanes):
            raise ValueError("a rank has a lane exactly when its local rank is below the smallest host's size")
        self.local, self.lane, self.flat = local, lane, flat
        self.hierarchical_allreduce = allreduce
        self.hierarchical_allgather = allgather
        self._scratch = np.empty(0, np.uint8)

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Hand the engine's per-call state (what runs, whether waits may spin) to the transports doing the work."""
        for p in (self.local, self.lane, self.flat):
            if p is not None:
                p.what, p.eager = self.what, self.eager

    def _local_counts(self, parts: list[int]) -> list[int]:
        """Per local rank: the lane parts for local ranks below L, nothing for the others."""
        return parts + [0] * (len(self._hosts[self._host]) - self._lanes)

    def _buffer(self, nbytes: int) -> np.ndarray:
        if self._scratch.size < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes]

    # -- collectives ----------------------------------------------------------------------------------------------
    def allreduce(self, src: np.ndarray, dst: np.ndarray, op: int) -> None:
        self._sync()
        if not self.hierarchical_allreduce:
            self.flat.allreduce(src, dst, op)
            return
        parts = even_counts(dst.size, self._lanes)
        counts = self._local_counts(parts)
        at = offsets(counts)[self._local_rank]
        mine = dst[at : at + counts[self._local_rank]]
        # src may be dst: the shared-memory reduce-scatter reads a rank's own slice only before writing it
        self.local.reducescatter(src, mine, counts, op)
        if self.lane is not None:
            self.lane.allreduce(mine, mine, op)
        size = dst.dtype.itemsize
        self.local.allgather(mine.view(np.uint8), dst.view(np.uint8), [c * size for c in counts])

    def reducescatter(self, src: np.ndarray, dst: np.ndarray, counts: list[int], op: int) -> None:
        self._sync()
        self.flat.reducescatter(src, dst, counts, op)

    def alltoall(
        self, src: np.ndarray, send_counts: list[int], dst: np.ndarray, recv_counts: list[int], max_block: int
    ) -> None:
        self._sync()
        self.flat.alltoall(src, send_counts, dst, recv_counts, max_block)

    def allgather(self, src: np.ndarray, dst: np.ndarray, counts: list[int]) -> None:
        self._sync()
        if not self.hierarchical_allgather:
            self.flat.allgather(src, dst, counts)
            return
        hosts, me, lanes = self._hosts, self._host, self._lanes
        blocks = [sum(counts[r] for r in rs) for rs in hosts]  # bytes of each host's contributions
        parts = [even_counts(b, lanes) for b in blocks]  # host h's block split into one part per lane
        part_at = [offsets(p) for p in parts]
        # lane i receives part i of every host's block, host after host
        lane_bytes = [sum(parts[h][i] for h in range(len(hosts))) for i in range(lanes)]
        scratch = self._buffer(blocks[me] + sum(lane_bytes))
        block, gathered = scratch[: blocks[me]], scratch[blocks[me] :]
        self.local.allgather(src, block, [counts[r] for r in hosts[me]])
        lane_at = offsets(lane_bytes)
        if self.lane is not None:
            i = self._local_rank
            received = gathered[lane_at[i] : lane_at[i] + lane_bytes[i]]
            self.lane.allgather(
                block[part_at[me][i] : part_at[me][i] + parts[me][i]],
                received,
                [parts[h][i] for h in range(len(hosts))],
            )
            mine = received
        else:
            mine = gathered[:0]
        self.local.allgather(mine, gathered, self._local_counts(lane_bytes))
        # gathered = [lane 0: host 0 part 0, host 1 part 0, ...][lane 1: ...]: put every byte where dst wants it
        rank_at = offsets(counts)
        for h, ranks in enumerate(hosts):
            # where each of the host's ranks starts inside its block, and in dst
            starts = offsets([counts[r] for r in ranks])
            for i in range(lanes):
                n = parts[h][i]
                if not n:
                    continue
                lo = part_at[h][i]  # the part covers block bytes [lo, lo + n)
                got = lane_at[i] + sum(parts[g][i] for g in range(h))
                piece = gathered[got : got + n]
                for r, s in zip(ranks, starts):
                    a, b = max(lo, s), min(lo + n, s + counts[r])
                    if a < b:
                        dst[rank_at[r] + a - s : rank_at[r] + b - s] = piece[a - lo : b - lo]

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        self._sync()
        if not self.hierarchical_allgather:
            self.flat.broadcast(buf, root)
            return
        root_host = next(h for h, rs in enumerate(self._hosts) if root in rs)
        if self._host == root_host:
            self.local.broadcast(buf, self._hosts[root_host].index(root))
        parts = even_counts(buf.size, self._lanes)
        counts = self._local_counts(parts)
        at = offsets(counts)[self._local_rank]
        mine = buf[at : at + counts[self._local_rank]]
        if self.lane is not None:
            self.lane.broadcast(mine, root_host)
        if self._host != root_host:
            self.local.allgather(mine, buf, counts)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        # shared memory first: the host's ranks stop at once; then the sockets, so the other hosts see EOF
        for p in (self.local, self.lane, self.flat):
            if p is not None:
                p.abort(reason)

    def close(self) -> None:
        for p in (self.local, self.lane, self.flat):
            if p is not None:
                p.close()
