"""Reducers: hand numbers, split-batch invariance, empty samples."""

import pytest
import torch

from relax.algorithms.reducers import (
    REDUCERS,
    count_global_normalisers,
    make_reducer,
    per_token_sum,
    sum_of_sample_mean,
)

VALUES_BT = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0], [4.0, 6.0, 8.0]])
MASK_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


def test_sum_of_sample_mean_hand_value():
    # sample means 2, 2, 6 -> sum 10 over 4 global samples
    out = sum_of_sample_mean(VALUES_BT, MASK_BT, num_global_samples=4)
    assert out.item() == pytest.approx(2.5)


def test_per_token_sum_hand_value():
    # masked sum 1 + 3 + 2 + 4 + 6 + 8 = 24 over 8 global tokens
    out = per_token_sum(VALUES_BT, MASK_BT, num_global_tokens=8)
    assert out.item() == pytest.approx(3.0)


@pytest.mark.parametrize("per_token", [False, True])
def test_summing_micro_batches_equals_the_unsplit_batch(per_token):
    torch.manual_seed(0)
    values_BT = torch.randn(6, 5)
    mask_BT = (torch.rand(6, 5) > 0.3).float()
    samples, tokens = count_global_normalisers(mask_BT)
    full = make_reducer(mask_BT, per_token_loss=per_token, num_global_samples=samples, num_global_tokens=tokens)
    split = sum(
        make_reducer(m, per_token_loss=per_token, num_global_samples=samples, num_global_tokens=tokens)(v)
        for v, m in zip(values_BT.split([1, 3, 2]), mask_BT.split([1, 3, 2]))
    )
    torch.testing.assert_close(split, full(values_BT))


def test_sample_mean_equals_mean_of_sample_means_for_whole_batch():
    out = sum_of_sample_mean(VALUES_BT, MASK_BT, num_global_samples=3)
    assert out.item() == pytest.approx((2 + 2 + 6) / 3)


def test_all_zero_mask_sample_contributes_zero_not_nan():
    values_BT = torch.tensor([[5.0, 5.0], [1.0, 3.0]])
    mask_BT = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    out = sum_of_sample_mean(values_BT, mask_BT, num_global_samples=2)
    assert out.item() == pytest.approx(1.0)
    empty = sum_of_sample_mean(values_BT, torch.zeros(2, 2), num_global_samples=2)
    assert empty.item() == 0.0


def test_gradient_flows_through_reducer():
    values_BT = VALUES_BT.clone().requires_grad_(True)
    sum_of_sample_mean(values_BT, MASK_BT, num_global_samples=3).backward()
    expected = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]]) / 3
    torch.testing.assert_close(values_BT.grad, expected)


def test_missing_or_bad_normaliser_is_a_clear_error():
    with pytest.raises(ValueError, match="num_global_tokens"):
        make_reducer(MASK_BT, per_token_loss=True, num_global_samples=3)
    with pytest.raises(ValueError, match="num_global_samples"):
        sum_of_sample_mean(VALUES_BT, MASK_BT, num_global_samples=0)
    with pytest.raises(ValueError, match="shape"):
        per_token_sum(VALUES_BT, MASK_BT[:, :2], num_global_tokens=3)


def test_registry_lists_both_reducers():
    assert REDUCERS == {"sum_of_sample_mean": sum_of_sample_mean, "per_token_sum": per_token_sum}
