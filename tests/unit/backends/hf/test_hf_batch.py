"""The running batch's KV cache bookkeeping: rows of one prompt share a prefill, caches of different
lengths merge left-padded, and columns that are padding in every row are trimmed."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from relax.backends.hf.batch import merge_caches, shared_prefill, trim_left_padding


def test_shared_prefill_maps_each_row_to_its_distinct_prompt():
    assert shared_prefill([[1, 2], [3], [1, 2], [3], [4]]) == ([[1, 2], [3], [4]], [0, 1, 0, 1, 2])


def _cache(*layers_BHTD) -> DynamicCache:
    return DynamicCache(ddp_cache_data=[(kv, -kv) for kv in layers_BHTD])


def test_merge_caches_left_pads_the_shorter_cache_and_stacks_the_rows():
    keys_a = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2) + 1  # B=2, T=3
    keys_b = torch.arange(1 * 1 * 5 * 2, dtype=torch.float32).reshape(1, 1, 5, 2) + 100  # B=1, T=5
    mask_a = torch.tensor([[1, 1, 1], [0, 1, 1]])
    mask_b = torch.tensor([[0, 1, 1, 1, 1]])
    cache, mask = merge_caches(_cache(keys_a, 2 * keys_a), mask_a, _cache(keys_b, 2 * keys_b), mask_b)
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]]
    for layer, scale in zip(cache.layers, (1, 2)):
        assert layer.keys.shape == (3, 1, 5, 2) and layer.values.shape == (3, 1, 5, 2)
        assert torch.equal(layer.keys[:2, :, :2], torch.zeros(2, 1, 2, 2))
        assert torch.equal(layer.keys[:2, :, 2:], scale * keys_a)
        assert torch.equal(layer.keys[2:], scale * keys_b)
        assert torch.equal(layer.values, -layer.keys)
    assert cache.get_seq_length() == 5


def test_merge_caches_pads_the_joining_group_when_it_is_shorter():
    keys_a, keys_b = torch.ones(1, 2, 4, 3), 2 * torch.ones(2, 2, 1, 3)
    cache, mask = merge_caches(_cache(keys_a), torch.ones(1, 4, dtype=torch.long),
                               _cache(keys_b), torch.ones(2, 1, dtype=torch.long))
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1]]
    assert cache.layers[0].keys[1:, :, :3].abs().sum() == 0 and torch.equal(cache.layers[0].keys[1:, :, 3:],
                                                                             keys_b)


def test_merge_caches_rejects_a_mask_that_does_not_cover_the_cache():
    with pytest.raises(ValueError, match="mask has 2 columns"):
        merge_caches(_cache(torch.ones(1, 1, 3, 2)), torch.ones(1, 2, dtype=torch.long),
                     _cache(torch.ones(1, 1, 3, 2)), torch.ones(1, 3, dtype=torch.long))


def test_trim_left_padding_drops_columns_that_are_padding_in_every_row():
    keys = torch.arange(2 * 1 * 4 * 1, dtype=torch.float32).reshape(2, 1, 4, 1)
    cache = _cache(keys)
    mask = trim_left_padding(cache, torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]]))
    assert mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert torch.equal(cache.layers[0].keys, keys[:, :, 1:]) and torch.equal(cache.layers[0].values, -keys[:, :, 1:])
    assert trim_left_padding(cache, mask) is mask  # nothing left to trim
