"""Per-token losses against hand-computed numbers, plus gradient behaviour."""

import math

import pytest
import torch

from relax.algorithms.losses import (
    POLICY_LOSSES,
    entropy_from_logits,
    gspo,
    opsm_mask,
    ppo_clip,
    sapo,
    tis_weights,
    value_loss,
)
from relax.algorithms.reducers import sum_of_sample_mean


def _logp_for_ratios(ratios):
    return torch.log(torch.tensor(ratios)), torch.zeros(len(ratios))


# ----------------------------------------------------------------------------- ppo


def test_ppo_clip_public_case():
    logp, old = _logp_for_ratios([0.5, 1.0, 1.5])
    loss, stats = ppo_clip(logp, old, torch.tensor([1.0, -1.0, 2.0]), eps_clip=0.2)
    torch.testing.assert_close(loss, torch.tensor([-0.5, 1.0, -2.4]))
    torch.testing.assert_close(stats["clipfrac"], torch.tensor([0.0, 0.0, 1.0]))


def test_ppo_dual_clip_public_case():
    logp, old = _logp_for_ratios([2.0, 2.0, 0.5])
    loss, stats = ppo_clip(logp, old, torch.tensor([2.0, -2.0, 2.0]), eps_clip=0.2, eps_clip_c=1.5)
    torch.testing.assert_close(loss, torch.tensor([-2.4, 3.0, -1.0]))
    torch.testing.assert_close(stats["dual_clipfrac"], torch.tensor([0.0, 1.0, 0.0]))


@pytest.mark.parametrize("bad_c", [1.0, 0.5])
def test_dual_clip_constant_must_exceed_one(bad_c):
    logp, old = _logp_for_ratios([1.0])
    with pytest.raises(ValueError, match="eps-clip-c"):
        ppo_clip(logp, old, torch.tensor([-1.0]), eps_clip=0.2, eps_clip_c=bad_c)


def test_eps_clip_high_widens_only_the_upper_bound():
    logp, old = _logp_for_ratios([1.25, 0.7])
    adv = torch.tensor([1.0, -1.0])
    loss, _ = ppo_clip(logp, old, adv, eps_clip=0.2, eps_clip_high=0.28)
    # 1.25 < 1.28 stays unclipped; 0.7 is clipped at the unchanged lower bound 0.8
    torch.testing.assert_close(loss, torch.tensor([-1.25, 0.8]))


def test_on_policy_ratio_is_one_and_nothing_is_clipped():
    logp = torch.randn(3, 5)
    adv = torch.randn(3, 5)
    loss, stats = ppo_clip(logp, logp.clone(), adv, eps_clip=0.2, eps_clip_c=3.0)
    torch.testing.assert_close(stats["ratio"], torch.ones(3, 5))
    assert stats["clipfrac"].sum().item() == 0.0
    torch.testing.assert_close(loss, -adv)


def test_ppo_gradient_is_minus_advantage_times_ratio_when_unclipped():
    logp = torch.tensor([0.0, 0.1], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    loss, _ = ppo_clip(logp, torch.zeros(2), adv, eps_clip=0.2)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv * torch.exp(logp.detach()))


# ----------------------------------------------------------------------------- gspo


def test_gspo_uses_masked_mean_sequence_ratio():
    logp_BT = torch.tensor([[0.1, 0.3], [0.1, 5.0]])  # 5.0 sits on padding and must be ignored
    old_BT = torch.zeros(2, 2)
    adv_BT = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    mask_BT = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = gspo(logp_BT, old_BT, adv_BT, mask_BT, eps_clip=0.2)
    # row 0: ratio exp(0.2) = 1.2214 clipped to 1.2 for A > 0; row 1: ratio exp(0.1), A = -1
    assert loss[0, 0].item() == pytest.approx(-1.2, abs=1e-6)
    assert loss[0, 1].item() == pytest.approx(-1.2, abs=1e-6)
    assert loss[1, 0].item() == pytest.approx(math.exp(0.1), abs=1e-6)
    torch.testing.assert_close(stats["ratio"][0], torch.full((2,), math.exp(0.2)))
    assert stats["clipfrac"][0].tolist() == [1.0, 1.0]


def test_gspo_gradient_stays_on_its_own_token():
    logp_BT = torch.tensor([[0.05, -0.05, 0.02]], requires_grad=True)
    adv_BT = torch.full((1, 3), 1.5)
    loss, stats = gspo(logp_BT, torch.zeros(1, 3), adv_BT, torch.ones(1, 3), eps_clip=0.2)
    loss[0, 0].backward()
    seq_ratio = stats["ratio"][0, 0].item()
    assert logp_BT.grad[0, 0].item() == pytest.approx(-1.5 * seq_ratio, abs=1e-6)
    assert logp_BT.grad[0, 1:].abs().sum().item() == 0.0


def test_gspo_sample_mean_gradient_matches_sequence_level_objective():
    torch.manual_seed(1)
    logp_BT = (0.05 * torch.randn(2, 4)).requires_grad_(True)
    old_BT = torch.zeros(2, 4)
    mask_BT = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv_B = torch.tensor([0.7, -0.4])
    adv_BT = adv_B.unsqueeze(-1).expand(2, 4)
    loss, _ = gspo(logp_BT, old_BT, adv_BT, mask_BT, eps_clip=0.5)  # wide clip: unclipped region
    sum_of_sample_mean(loss, mask_BT, num_global_samples=2).backward()
    ours = logp_BT.grad.clone()

    logp_ref = logp_BT.detach().clone().requires_grad_(True)
    seq_ratio = torch.exp((logp_ref * mask_BT).sum(-1) / mask_BT.sum(-1))
    (-(adv_B * seq_ratio).sum() / 2).backward()
    torch.testing.assert_close(ours, logp_ref.grad)


# ----------------------------------------------------------------------------- sapo


def test_sapo_public_case_on_policy_positive_advantage():
    loss, _ = sapo(torch.zeros(1), torch.zeros(1), torch.ones(1), tau_pos=1.0, tau_neg=1.05)
    assert loss.item() == pytest.approx(-2.0)


def test_sapo_uses_tau_neg_for_negative_advantages():
    logp, old = _logp_for_ratios([1.0, 2.0])
    loss, _ = sapo(logp, old, torch.tensor([-1.0, 1.0]), tau_pos=1.0, tau_neg=2.0)
    # A < 0: -(4/2) * sigmoid(0) * -1 = 1.0 ; A > 0, r = 2: -4 * sigmoid(1)
    torch.testing.assert_close(loss, torch.tensor([1.0, -4.0 / (1.0 + math.exp(-1.0))]))


def test_sapo_gradient_matches_ppo_on_policy():
    logp = torch.zeros(2, requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    loss, _ = sapo(logp, torch.zeros(2), adv, tau_pos=1.0, tau_neg=1.05)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv)


# ----------------------------------------------------------------------------- value, entropy


def test_value_loss_hand_values():
    values = torch.tensor([1.0, 2.0])
    old = torch.tensor([0.5, 2.0])
    returns = torch.tensor([2.0, 1.0])
    loss, stats = value_loss(values, old, returns, value_clip=0.2)
    # row 0: clipped value 0.7 -> (0.7 - 2)^2 = 1.69 beats (1 - 2)^2 = 1
    torch.testing.assert_close(loss, torch.tensor([0.845, 0.5]))
    torch.testing.assert_close(stats["clipfrac"], torch.tensor([1.0, 0.0]))


def test_entropy_of_uniform_logits_is_log_vocab():
    out = entropy_from_logits(torch.zeros(2, 3, 4))
    torch.testing.assert_close(out, torch.full((2, 3), math.log(4)))


def test_entropy_is_stable_for_huge_logits():
    out = entropy_from_logits(torch.tensor([[[1000.0, 1000.0, -1000.0]]]))
    assert out.item() == pytest.approx(math.log(2), abs=1e-6)


def test_entropy_matches_definition_on_random_logits():
    logits = torch.randn(2, 3, 7, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))


def test_entropy_of_bf16_logits_is_computed_in_float32():
    assert entropy_from_logits(torch.zeros(1, 2, 5, dtype=torch.bfloat16)).dtype == torch.float32


# ----------------------------------------------------------------------------- tis, opsm


def test_tis_weights_are_truncated_and_detached():
    old = torch.tensor([0.0, math.log(3.0), -math.log(10.0)], requires_grad=True)
    weights = tis_weights(old, torch.zeros(3), clip=2.0, clip_low=0.5)
    torch.testing.assert_close(weights, torch.tensor([1.0, 2.0, 0.5]))
    assert not weights.requires_grad


def test_tis_clip_low_above_clip_is_rejected():
    with pytest.raises(ValueError, match="--tis-clip-low"):
        tis_weights(torch.zeros(1), torch.zeros(1), clip=1.0, clip_low=2.0)


def test_opsm_drops_only_negative_advantage_sequences_that_drifted():
    old_BT = torch.zeros(3, 3)
    logp_BT = torch.tensor([[-0.5, -0.5, 9.0], [0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv_B = torch.tensor([-1.0, -1.0, 1.0])
    keep = opsm_mask(logp_BT, old_BT, adv_B, mask_BT, delta=1e-4)
    # row 0: mean(old - logp) = 0.5 > delta and A < 0 -> dropped; row 1: no drift; row 2: A > 0
    torch.testing.assert_close(keep, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]))


def test_registry_holds_the_three_policy_losses():
    assert POLICY_LOSSES == {"ppo": ppo_clip, "gspo": gspo, "sapo": sapo}
