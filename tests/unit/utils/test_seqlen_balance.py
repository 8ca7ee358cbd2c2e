"""Karmarkar-Karp equal-size partitions (`relax.utils.seqlen_balance`): every row once, equal
row counts, and token sums far more even than a contiguous split."""

from __future__ import annotations

import random

import pytest

from relax.utils.seqlen_balance import balanced_partitions


def sums(lengths: list[int], parts: list[list[int]]) -> list[int]:
    return [sum(lengths[i] for i in p) for p in parts]


@pytest.mark.parametrize("n, k", [(64, 4), (8, 2), (6, 3), (5, 1)])
def test_parts_cover_every_row_once_with_equal_counts(n, k):
    lengths = [random.Random(n).randint(1, 500) for _ in range(n)]
    parts = balanced_partitions(lengths, k)
    assert len(parts) == k and {len(p) for p in parts} == {n // k}
    assert sorted(i for p in parts for i in p) == list(range(n))


def test_token_sums_are_balanced_where_a_contiguous_split_is_not():
    rng = random.Random(0)
    lengths = [rng.randint(1, 1000) for _ in range(64)]
    contiguous = sums(lengths, [list(range(r * 16, (r + 1) * 16)) for r in range(4)])
    balanced = sums(lengths, balanced_partitions(lengths, 4))
    assert max(balanced) - min(balanced) <= 10 < max(contiguous) - min(contiguous)


def test_long_rows_are_spread_over_the_parts():
    lengths = [1000, 1000, 10, 10, 10, 10, 1000, 1000]  # contiguous halves: 2030 vs 2030 but quarters skew
    parts = balanced_partitions(lengths, 4)
    assert sorted(sums(lengths, parts)) == [1010, 1010, 1010, 1010]


def test_rows_that_do_not_split_evenly_are_refused():
    with pytest.raises(ValueError, match="5 rows do not split into 2 parts"):
        balanced_partitions([1] * 5, 2)
