"""Split rows into k parts of equal row count whose token sums are as even as possible
(`--balance-data`: every data-parallel rank of a step gets about the same number of tokens, so
none waits for a rank that drew the long responses).

The Karmarkar-Karp largest differencing method, as slime and verl balance sequence lengths
(`get_seqlen_balanced_partitions`): start from partial solutions of k rows each (the rows sorted
by length, one per part), repeatedly merge the two solutions with the largest spread, pairing the
heaviest part of one with the lightest of the other, until one solution is left. Pure Python.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass
class _Part:
    total: int = 0
    rows: list[int] = field(default_factory=list)

    def merge(self, other: _Part) -> None:
        self.total += other.total
        self.rows += other.rows


def _spread(parts: list[_Part]) -> int:
    return parts[0].total - parts[-1].total  # parts are kept heaviest first


def balanced_partitions(lengths: list[int], k: int) -> list[list[int]]:
    """`len(lengths) / k` row indices per part (sorted), token sums balanced. `len(lengths)` must
    be a multiple of `k`."""
    if k < 1 or len(lengths) % k:
        raise ValueError(f"{len(lengths)} rows do not split into {k} parts of equal size")
    if k == 1 or not lengths:
        return [list(range(len(lengths)))] + [[] for _ in range(k - 1)]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    tie = itertools.count()  # heap ties: first built first
    heap: list[tuple[int, int, list[_Part]]] = []
    for start in range(0, len(order), k):
        parts = sorted((_Part(lengths[i], [i]) for i in order[start:start + k]), key=lambda p: -p.total)
        heapq.heappush(heap, (-_spread(parts), next(tie), parts))
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        for part, other in zip(first, reversed(second)):  # heaviest with lightest
            part.merge(other)
        first.sort(key=lambda p: -p.total)
        heapq.heappush(heap, (-_spread(first), next(tie), first))
    return [sorted(p.rows) for p in heap[0][2]]
