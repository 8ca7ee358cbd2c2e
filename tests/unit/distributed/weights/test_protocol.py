"""The protocol's wire helpers: buckets in order under the size limit, dtype names, request validation."""

from __future__ import annotations

import pytest
import torch

from relax.distributed.weights.protocol import dtype_name, iter_buckets, parse_dtype, parse_specs


def test_iter_buckets_keeps_order_and_size_limit():
    tensors = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 1])]
    buckets = list(iter_buckets(tensors, bucket_bytes=80))
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4"]]  # t2 (120 B) alone
    with pytest.raises(ValueError):
        list(iter_buckets(tensors, 0))


def test_dtype_names_round_trip_and_bad_requests_name_the_problem():
    assert parse_dtype(dtype_name(torch.bfloat16)) is torch.bfloat16 and parse_dtype("torch.float32") is torch.float32
    with pytest.raises(ValueError, match="unknown dtype 'float7'"):
        parse_dtype("float7")
    with pytest.raises(ValueError, match="same length"):
        parse_specs(["a", "b"], ["float32"], [[1]])
    with pytest.raises(ValueError, match="negative dimension"):
        parse_specs(["a"], ["float32"], [[-1]])
