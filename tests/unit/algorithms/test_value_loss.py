"""The critic's per-micro-batch loss against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.value_loss import ValueLossInputs, compute_value_loss


def test_clipped_value_loss_is_reduced_per_sample_then_over_the_global_batch():
    values = torch.tensor([[1.0, 0.0], [0.5, 9.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0], [0.5, 0.0]])
    returns = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = compute_value_loss(ValueLossInputs(values, old, returns, mask, num_global_samples=4), value_clip=0.2)
    # row 0: token 0 unclipped (1-1)^2=0, clipped (0.2-1)^2=0.64 -> 0.32; token 1: 0.5 * 1 = 0.5 -> mean 0.41
    # row 1: token 0: (0.5-0)^2 = 0.25 both ways -> 0.125; token 1 masked
    assert out.loss.item() == pytest.approx((0.41 + 0.125) / 4)
    assert out.metrics["value_clipfrac"].item() == pytest.approx((0.5 + 0.0) / 4)
    out.loss.backward()
    assert values.grad[1, 1] == 0  # masked tokens get no gradient


def test_per_token_reduction_divides_by_global_tokens():
    values, zeros = torch.tensor([[2.0, 2.0]]), torch.zeros(1, 2)
    out = compute_value_loss(ValueLossInputs(values, values, zeros, torch.ones(1, 2), num_global_tokens=4),
                             value_clip=0.2, per_token_loss=True)
    assert out.loss.item() == pytest.approx(2 * 0.5 * 4 / 4)
