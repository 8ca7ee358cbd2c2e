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


def test_a_flat_bucket_reads_back_whether_packed_in_one_copy_or_tensor_by_tensor():
    """pack_flat copies back-to-back tensors (every size a multiple of the alignment) in one
    kernel and pads the others tensor by tensor; flat_views reads both back exactly."""
    from relax.distributed.weights.protocol import FLAT_ALIGN, TensorSpec, flat_views, pack_flat

    aligned = [torch.randn(8, 16), torch.randn(128).to(torch.bfloat16), torch.arange(7)]  # last may be any size
    ragged = [torch.randn(3), torch.randn(5, 2).to(torch.bfloat16), torch.randint(0, 9, (4,), dtype=torch.int32)]
    for tensors in (aligned, ragged, [t.t() for t in aligned[:1]]):  # (a transposed view: not contiguous)
        flat = pack_flat(tensors, "cpu")
        specs = [TensorSpec(f"t{i}", t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)]
        assert all(torch.equal(a, b) for a, b in zip(flat_views(flat, specs), tensors))
    assert all(t.numel() * t.element_size() % FLAT_ALIGN == 0 for t in aligned[:-1])


def test_a_bucket_of_one_dtype_packs_and_cuts_in_one_call_each_into_copies_and_views():
    """The common bucket (one dtype, no padding) is packed by `flatten_dense_tensors` and cut by
    `cut_flat` (`unflatten_dense_tensors`) given tensors of its shapes: the bytes the padded layout's
    reader reads, a copy of the sources (a later write to them leaves the bucket alone), views of the buffer."""
    from relax.distributed.weights.protocol import TensorSpec, cut_flat, flat_views, pack_flat, unpadded

    tensors = [torch.randn(16, 32).to(torch.bfloat16), torch.randn(256).to(torch.bfloat16),
               torch.randn(3, 5).to(torch.bfloat16)]  # (sizes multiples of FLAT_ALIGN; the last may end anywhere)
    assert unpadded([t.numel() * 2 for t in tensors]) and not unpadded([30, 2])
    flat = pack_flat(tensors, "cpu")
    assert flat.dtype == torch.uint8 and flat.numel() == sum(t.numel() * 2 for t in tensors)
    specs = [TensorSpec(f"t{i}", t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)]
    fast, slow = cut_flat(flat, torch.bfloat16, [torch.empty_like(t) for t in tensors]), flat_views(flat, specs)
    assert all(torch.equal(a, b) and torch.equal(a, t) and a.shape == t.shape for a, b, t in zip(fast, slow, tensors))
    assert all(v.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for v in fast)
    before = flat.clone()
    tensors[0].add_(1)
    assert torch.equal(flat, before)  # packed by copy
    one = [torch.randn(8, 8).to(torch.bfloat16)]
    packed = pack_flat(one, "cpu")
    one[0].add_(1)
    assert not torch.equal(flat_views(packed, [TensorSpec("w", torch.bfloat16, (8, 8))])[0], one[0])  # a copy too
