"""Micro-batch splitting and response alignment of the fsdp backend."""

import torch

from relax.backends.batching import pad_inputs, pad_response, response_positions, split_micro_batches


def test_fixed_micro_batches_cover_all_rows_in_order():
    assert split_micro_batches([5] * 5, micro_batch_size=2) == [[0, 1], [2, 3], [4]]


def test_dynamic_batches_respect_token_budget_and_keep_long_samples_alone():
    assert split_micro_batches([3, 3, 3, 10, 2], micro_batch_size=1, max_tokens=6) == [[0, 1], [2], [3], [4]]


def test_dynamic_batches_count_the_padded_rectangle():
    # 2 + 2 + 8 real tokens fit 12, but padded to the longest row they are 3 x 8 = 24
    assert split_micro_batches([2, 2, 8, 1, 1, 1], micro_batch_size=1, max_tokens=12) == [[0, 1], [2], [3, 4, 5]]
    lengths = [40] * 30 + [560]  # long-tailed: many short rows, then a long one
    for idx in split_micro_batches(lengths, micro_batch_size=1, max_tokens=1024):
        assert len(idx) * max(lengths[i] for i in idx) <= 1024 or len(idx) == 1


def test_response_log_probs_are_read_at_shifted_positions():
    tokens = [[10, 11, 12, 13], [20, 21, 22]]  # responses: [12, 13] and [21, 22]
    ids, mask = pad_inputs(tokens)
    assert ids.tolist() == [[10, 11, 12, 13], [20, 21, 22, 0]] and mask[1].tolist() == [1, 1, 1, 0]
    index, rmask = response_positions([4, 3], [2, 2])
    targets = ids[:, 1:].gather(1, index)
    assert targets.tolist() == [[12, 13], [21, 22]] and rmask.all()


def test_pad_response_right_pads_with_zeros():
    out = pad_response([[1.0], [2.0, 3.0]], 3)
    assert torch.equal(out, torch.tensor([[1.0, 0, 0], [2.0, 3.0, 0]]))
