"""KL estimators against hand-computed values."""

import math

import pytest
import torch

from relax.algorithms.kl import KL_ESTIMATORS, approx_kl, unbiased_kl


def test_registry_names_match_kl_loss_type_flag_choices():
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3", "low_var_kl"}


def test_k1_k2_k3_hand_values():
    logp = torch.tensor([math.log(2.0), 0.0, -1.0])
    ref = torch.tensor([0.0, 0.0, 0.0])
    x = [math.log(2.0), 0.0, -1.0]
    torch.testing.assert_close(approx_kl(logp, ref, "k1"), torch.tensor(x))
    torch.testing.assert_close(approx_kl(logp, ref, "k2"), torch.tensor([v * v / 2 for v in x]))
    k3 = [math.exp(-v) - 1 + v for v in x]  # ln2 -> 0.5 - 1 + 0.6931 = 0.1931
    torch.testing.assert_close(approx_kl(logp, ref, "k3"), torch.tensor(k3))
    assert approx_kl(logp, ref, "k3")[0].item() == pytest.approx(0.19314718, abs=1e-6)


def test_k3_is_non_negative_and_zero_on_identical_policies():
    logp = torch.randn(64)
    assert (approx_kl(logp, logp.roll(1), "k3") >= 0).all()
    assert approx_kl(logp, logp, "k3").abs().max().item() == 0.0


def test_low_var_kl_is_k3_clamped_to_ten():
    logp = torch.tensor([-20.0, 0.5])
    ref = torch.tensor([0.0, 0.0])
    out = approx_kl(logp, ref, "low_var_kl")
    assert out[0].item() == 10.0  # k3 = exp(20) - 21, clamped
    assert out[1].item() == pytest.approx(math.exp(-0.5) - 1 + 0.5, abs=1e-6)


def test_unknown_kind_names_the_flag():
    with pytest.raises(ValueError, match="--kl-loss-type"):
        approx_kl(torch.zeros(2), torch.zeros(2), "k4")


def test_unbiased_kl_multiplies_by_policy_over_old_ratio():
    kl = torch.tensor([0.2, 0.4])
    logp = torch.tensor([math.log(0.5), 0.0])
    old = torch.tensor([0.0, 0.0])
    torch.testing.assert_close(unbiased_kl(kl, logp, old), torch.tensor([0.1, 0.4]))


def test_kl_gradient_flows_to_logp():
    logp = torch.tensor([0.3, -0.2], requires_grad=True)
    approx_kl(logp, torch.zeros(2), "k2").sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.3, -0.2]))
