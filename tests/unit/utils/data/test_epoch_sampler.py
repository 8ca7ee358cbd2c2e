"""EpochSampler: per-epoch order, epoch crossing and exact resume."""

from __future__ import annotations

import random

import pytest

from relax.utils.data.sampler import EpochSampler, epoch_permutation


def test_unshuffled_epochs_repeat_file_order_across_the_boundary():
    sampler = EpochSampler(4, shuffle=False, seed=0)
    assert sampler.take(3) == [0, 1, 2]
    assert sampler.take(3) == [3, 0, 1]
    assert sampler.epoch == 1 and sampler.offset == 2


def test_shuffled_epoch_order_matches_slimes_global_random_shuffle():
    order = list(range(10))
    random.seed(42 + 3)
    random.shuffle(order)  # what slime's Dataset.shuffle(3) does with --rollout-seed 42
    assert epoch_permutation(10, 3, shuffle=True, seed=42) == order


def test_each_epoch_is_a_permutation_and_epochs_differ():
    sampler = EpochSampler(8, shuffle=True, seed=1)
    first, second = sampler.take(8), sampler.take(8)
    assert sorted(first) == sorted(second) == list(range(8))
    assert first != second


def test_same_seed_gives_same_order_and_other_seed_differs():
    assert EpochSampler(20, shuffle=True, seed=5).take(30) == EpochSampler(20, shuffle=True, seed=5).take(30)
    assert EpochSampler(20, shuffle=True, seed=5).take(20) != EpochSampler(20, shuffle=True, seed=6).take(20)


def test_take_can_span_several_epochs():
    assert EpochSampler(2, shuffle=False, seed=0).take(5) == [0, 1, 0, 1, 0]


def test_restored_sampler_continues_identically():
    original = EpochSampler(7, shuffle=True, seed=3)
    original.take(10)
    restored = EpochSampler(7, shuffle=True, seed=3)
    restored.load_state_dict(original.state_dict())
    assert restored.take(12) == original.take(12)


def test_empty_dataset_is_refused_with_a_hint():
    with pytest.raises(ValueError, match="--rollout-max-prompt-len"):
        EpochSampler(0, shuffle=False, seed=0)


def test_offset_beyond_dataset_is_refused_on_load():
    with pytest.raises(ValueError, match="different dataset"):
        EpochSampler(3, shuffle=False, seed=0).load_state_dict({"epoch": 0, "offset": 9})
