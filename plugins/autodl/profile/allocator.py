"""Replaying allocation events through a model of Paddle's GPU allocator (``auto_growth``) to predict reserved memory.

Details: docs/reference/estimator.md#autodlprofileallocator.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

CUDA_ALIGNMENT = 256
"""Bytes: ``platform::GpuMinChunkSize()`` in Paddle (``paddle/phi/core/platform/device/gpu/gpu_info.cc``)."""


@dataclass(eq=False)
class _Block:
    size: int
    free: bool
    chunk: int
    prev: "_Block | None" = None
    next: "_Block | None" = None


@dataclass
class ReplayResult:
    """Peak bytes of the replay (allocated: what the tensors asked, aligned; reserved: the chunks)."""

    peak_allocated: int
    peak_reserved: int
    chunks: int
    events: int
    unmatched_frees: int = 0
    reserved_at: list[tuple[int, int]] = field(default_factory=list)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class _AutoGrowthPool:
    """The ``auto_growth`` best-fit pool: free blocks sorted by size, chunks reserved and never returned."""

    def __init__(self, alignment: int, chunk_bytes: int) -> None:
        self.alignment = alignment
        self.chunk_bytes = chunk_bytes
        self.free_sizes: list[tuple[int, int]] = []  # sorted (size, id)
        self.free_by_id: dict[int, _Block] = {}
        self.reserved = 0
        self.chunks = 0

    def add_free(self, b: _Block) -> None:
        bisect.insort(self.free_sizes, (b.size, id(b)))
        self.free_by_id[id(b)] = b

    def remove_free(self, b: _Block) -> None:
        i = bisect.bisect_left(self.free_sizes, (b.size, id(b)))
        if i < len(self.free_sizes) and self.free_sizes[i] == (b.size, id(b)):
            self.free_sizes.pop(i)
        self.free_by_id.pop(id(b), None)

    def allocate(self, size: int) -> _Block:
        """The best-fitting free block for ``size`` bytes (aligned), else a new chunk."""
        size = _align(max(1, size), self.alignment)
        i = bisect.bisect_left(self.free_sizes, (size, -1))
        if i < len(self.free_sizes):
            _, bid = self.free_sizes.pop(i)
            return self._take_tail(self.free_by_id.pop(bid), size)
        return self._new_chunk(size)

    def _take_tail(self, blk: _Block, size: int) -> _Block:
        rest = blk.size - size
        if rest > 0:  # the free remainder stays in front, the allocation takes the tail (as Paddle does)
            rem = _Block(rest, True, blk.chunk, blk.prev, blk)
            if blk.prev is not None:
                blk.prev.next = rem
            blk.prev = rem
            blk.size = size
            self.add_free(rem)
        blk.free = False
        return blk

    def _new_chunk(self, size: int) -> _Block:
        real = max(size, self.chunk_bytes)
        self.chunks += 1
        self.reserved += real
        blk = _Block(size, False, self.chunks)
        if real > size:
            rem = _Block(real - size, True, self.chunks, None, blk)
            blk.prev = rem
            self.add_free(rem)
        return blk

    def release(self, blk: _Block) -> None:
        """Free ``blk``, merged with its free neighbours in the same chunk."""
        blk.free = True
        p, n = blk.prev, blk.next
        if p is not None and p.free and p.chunk == blk.chunk:
            self.remove_free(p)
            blk.size += p.size
            blk.prev = p.prev
            if p.prev is not None:
                p.prev.next = blk
        if n is not None and n.free and n.chunk == blk.chunk:
            self.remove_free(n)
            blk.size += n.size
            blk.next = n.next
            if n.next is not None:
                n.next.prev = blk
        self.add_free(blk)


def replay_auto_growth(events: list[tuple[int, int]], *, preexisting: Sequence[int] = (),
                       alignment: int = CUDA_ALIGNMENT, chunk_bytes: int = 0) -> ReplayResult:
    """Replay allocation events through the ``auto_growth`` best-fit model.

    :param events: ``(address, delta_bytes)`` in time order: a positive delta allocates at ``address``, a negative
        one frees the allocation made there.
    :param preexisting: sizes of allocations alive before the events (parameters, optimizer state...), each in its
        own chunk (what ``auto_growth`` does when nothing was freed yet). A free of an address not allocated in
        ``events`` releases that much of them as a free block of its own (its chunk stays reserved).
    :param alignment: request rounding, bytes.
    :param chunk_bytes: ``FLAGS_auto_growth_chunk_size_in_mb`` in bytes (0: a chunk per unmatched request).
    :returns: peak allocated and reserved bytes.
    """
    pool = _AutoGrowthPool(alignment, chunk_bytes)
    live: dict[int, _Block] = {}
    allocated = 0
    unmatched = 0
    for s in preexisting:
        pool.allocate(int(s))
        allocated += _align(int(s), alignment)
    peak_alloc, peak_res = allocated, pool.reserved
    for addr, delta in events:
        if delta > 0:
            if addr in live:  # an address reused without its free recorded: release the stale one first
                old = live.pop(addr)
                allocated -= old.size
                pool.release(old)
            blk = pool.allocate(delta)
            live[addr] = blk
            allocated += blk.size
        elif delta < 0:
            freed = live.pop(addr, None)
            if freed is None:  # made before the recording (counted in ``preexisting``): it was its own chunk
                unmatched += 1
                size = _align(-delta, alignment)
                allocated -= size
                pool.add_free(_Block(size, True, -unmatched))
                continue
            allocated -= freed.size
            pool.release(freed)
        peak_alloc = max(peak_alloc, allocated)
        peak_res = max(peak_res, pool.reserved)
    return ReplayResult(peak_allocated=peak_alloc, peak_reserved=peak_res, chunks=pool.chunks, events=len(events),
                        unmatched_frees=unmatched)


__all__ = ["replay_auto_growth", "ReplayResult", "CUDA_ALIGNMENT"]
