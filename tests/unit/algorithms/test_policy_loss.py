"""compute_policy_loss: invariants, composition of the pieces, global-normaliser metrics."""

import math

import pytest
import torch

from relax.algorithms.kl import approx_kl
from relax.algorithms.losses import ppo_clip
from relax.algorithms.policy_loss import (
    PolicyLossConfig,
    PolicyLossInputs,
    PolicyLossOutput,
    combine_metrics,
    compute_policy_loss,
)
from relax.algorithms.reducers import sum_of_sample_mean

MASK_BT = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _batch(seed=0, **overrides):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(2, 3, generator=g)).requires_grad_(True)
    fields = dict(
        logp=logp,
        old_logp=logp.detach() + 0.05 * torch.randn(2, 3, generator=g),
        advantages=torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]),
        mask_BT=MASK_BT,
        num_global_samples=2,
        num_global_tokens=5,
    )
    fields.update(overrides)
    return PolicyLossInputs(**fields)


def test_on_policy_step_has_zero_ppo_kl_and_clipfrac():
    logp = torch.randn(2, 3, requires_grad=True)
    batch = _batch(logp=logp, old_logp=logp.detach().clone(), rollout_logp=logp.detach().clone())
    out = compute_policy_loss(batch, PolicyLossConfig(eps_clip_c=3.0))
    assert out.metrics["ppo_kl"].item() == 0.0
    assert out.metrics["pg_clipfrac"].item() == 0.0
    assert out.metrics["train_rollout_logprob_abs_diff_mean"].item() == 0.0
    assert out.metrics["train_rollout_importance_ratio_max"].item() == pytest.approx(1.0)
    # ratio 1: pg_loss = -mean advantage per sample, averaged: (-1 + 1) / 2
    assert out.metrics["pg_loss"].item() == pytest.approx(0.0, abs=1e-7)


def test_pg_loss_is_sample_mean_of_ppo_clip():
    batch = _batch()
    out = compute_policy_loss(batch, PolicyLossConfig())
    per_token, _ = ppo_clip(batch.logp, batch.old_logp, batch.advantages, eps_clip=0.2)
    expected = sum_of_sample_mean(per_token, MASK_BT, num_global_samples=2)
    torch.testing.assert_close(out.metrics["pg_loss"], expected.detach())
    torch.testing.assert_close(out.loss.detach(), expected.detach())


def test_per_token_loss_divides_by_global_token_count():
    batch = _batch()
    out = compute_policy_loss(batch, PolicyLossConfig(per_token_loss=True))
    per_token, _ = ppo_clip(batch.logp, batch.old_logp, batch.advantages, eps_clip=0.2)
    assert out.metrics["pg_loss"].item() == pytest.approx((per_token * MASK_BT).sum().item() / 5, abs=1e-6)


def test_loss_backward_reaches_logp_and_only_valid_tokens():
    batch = _batch()
    out = compute_policy_loss(batch, PolicyLossConfig())
    out.loss.backward()
    assert batch.logp.grad is not None
    assert batch.logp.grad[1, 2].item() == 0.0
    assert batch.logp.grad[0].abs().sum().item() > 0


@pytest.mark.parametrize("per_token", [False, True])
def test_micro_batch_sums_equal_the_full_batch(per_token):
    torch.manual_seed(0)
    logp = torch.randn(4, 5) * 0.1 - 1
    old = logp + 0.1 * torch.randn(4, 5)
    ref = logp + 0.1 * torch.randn(4, 5)
    rollout = old + 0.05 * torch.randn(4, 5)
    adv = torch.randn(4, 1).expand(4, 5).contiguous()
    mask = torch.tensor([[1.0] * 5, [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    cfg = PolicyLossConfig(per_token_loss=per_token, use_kl_loss=True, kl_loss_coef=0.1, use_tis=True,
                           entropy_coef=0.01)
    entropy = torch.rand(4, 5)

    def run(rows):
        return compute_policy_loss(PolicyLossInputs(
            logp=logp[rows], old_logp=old[rows], advantages=adv[rows], mask_BT=mask[rows], ref_logp=ref[rows],
            rollout_logp=rollout[rows], entropy=entropy[rows], num_global_samples=4,
            num_global_tokens=int(mask.sum())), cfg)

    full = run(slice(0, 4))
    parts = [run(slice(0, 1)), run(slice(1, 4))]
    combined = combine_metrics([p.metrics for p in parts], parts[0].reduce_ops)
    for key, value in full.metrics.items():
        assert combined[key] == pytest.approx(value.item(), abs=1e-6), key
    assert full.reduce_ops["train_rollout_importance_ratio_min"] == "min"
    assert full.reduce_ops["train_rollout_logprob_abs_diff_max"] == "max"


def test_kl_loss_is_added_with_its_coefficient():
    ref = torch.zeros(2, 3)
    batch = _batch(ref_logp=ref)
    base = compute_policy_loss(batch, PolicyLossConfig())
    out = compute_policy_loss(batch, PolicyLossConfig(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k3"))
    kl = sum_of_sample_mean(approx_kl(batch.logp, ref, "k3"), MASK_BT, num_global_samples=2)
    torch.testing.assert_close(out.metrics["kl_loss"], kl.detach())
    torch.testing.assert_close(out.loss.detach(), base.loss.detach() + 0.5 * kl.detach())


def test_zero_kl_coef_reports_kl_without_changing_the_loss():
    batch = _batch(ref_logp=torch.zeros(2, 3))
    out = compute_policy_loss(batch, PolicyLossConfig(use_kl_loss=True, kl_loss_coef=0.0))
    assert out.metrics["kl_loss"].item() != 0.0
    torch.testing.assert_close(out.loss.detach(), out.metrics["pg_loss"])


def test_unbiased_kl_weights_kl_by_policy_over_old_ratio():
    ref = torch.zeros(2, 3)
    batch = _batch(ref_logp=ref)
    out = compute_policy_loss(batch, PolicyLossConfig(use_kl_loss=True, kl_loss_coef=0.1, use_unbiased_kl=True))
    kl_BT = torch.exp(batch.logp - batch.old_logp) * approx_kl(batch.logp, ref, "k1")
    expected = sum_of_sample_mean(kl_BT, MASK_BT, num_global_samples=2)
    torch.testing.assert_close(out.metrics["kl_loss"], expected.detach())


def test_entropy_bonus_lowers_the_loss():
    entropy = torch.full((2, 3), 2.0)
    out = compute_policy_loss(_batch(entropy=entropy), PolicyLossConfig(entropy_coef=0.1))
    assert out.metrics["entropy"].item() == pytest.approx(2.0)
    assert out.loss.item() == pytest.approx(out.metrics["pg_loss"].item() - 0.2, abs=1e-6)


def test_tis_scales_the_per_token_loss_by_truncated_weights():
    logp = torch.zeros(1, 2, requires_grad=True)
    batch = PolicyLossInputs(logp=logp, old_logp=torch.zeros(1, 2), advantages=torch.ones(1, 2),
                             mask_BT=torch.ones(1, 2), rollout_logp=torch.tensor([[0.0, -math.log(4.0)]]),
                             num_global_samples=1)
    out = compute_policy_loss(batch, PolicyLossConfig(use_tis=True, tis_clip=2.0))
    # per-token loss -1 on both tokens; weights 1 and min(4, 2) = 2 -> mean -1.5
    assert out.loss.item() == pytest.approx(-1.5)
    assert out.metrics["tis_clipfrac"].item() == pytest.approx(0.5)
    assert out.metrics["train_rollout_importance_ratio_max"].item() == pytest.approx(4.0)
    assert out.metrics["train_rollout_logprob_abs_diff_max"].item() == pytest.approx(math.log(4.0))


def test_opsm_removes_drifted_negative_sequences_from_the_loss():
    logp = torch.tensor([[-1.0, -1.0], [0.0, 0.0]], requires_grad=True)
    batch = PolicyLossInputs(logp=logp, old_logp=torch.zeros(2, 2), advantages=torch.tensor([[-1.0, -1.0],
                             [1.0, 1.0]]), mask_BT=torch.ones(2, 2), num_global_samples=2)
    out = compute_policy_loss(batch, PolicyLossConfig(use_opsm=True))
    # sample 0 dropped; sample 1 on policy with A = 1 -> -1; averaged over 2 samples
    assert out.loss.item() == pytest.approx(-0.5)
    assert out.metrics["opsm_clipfrac"].item() == pytest.approx(0.5)
    out.loss.backward()
    assert logp.grad[0].abs().sum().item() == 0.0


@pytest.mark.parametrize("loss", ["gspo", "sapo"])
def test_other_policy_losses_run_and_backprop(loss):
    batch = _batch()
    out = compute_policy_loss(batch, PolicyLossConfig(loss=loss))
    out.loss.backward()
    assert torch.isfinite(batch.logp.grad).all()
    assert {"pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss", "entropy"} <= set(out.metrics)


def test_custom_pg_loss_reducer_replaces_only_pg_loss():
    out = compute_policy_loss(_batch(), PolicyLossConfig(pg_loss_reducer=lambda values_BT: values_BT.sum() * 0 + 7.0))
    assert out.metrics["pg_loss"].item() == 7.0
    assert out.metrics["ppo_kl"].item() != 7.0


def test_missing_inputs_are_reported_with_the_flag():
    with pytest.raises(ValueError, match="--use-kl-loss"):
        compute_policy_loss(_batch(), PolicyLossConfig(use_kl_loss=True, kl_loss_coef=0.1))
    with pytest.raises(ValueError, match="--use-tis"):
        compute_policy_loss(_batch(), PolicyLossConfig(use_tis=True))
    with pytest.raises(ValueError, match="--entropy-coef"):
        compute_policy_loss(_batch(), PolicyLossConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="expected"):
        compute_policy_loss(_batch(advantages=torch.ones(2, 4)), PolicyLossConfig())


def test_bad_config_values_are_rejected_at_construction():
    with pytest.raises(ValueError, match="policy loss"):
        PolicyLossConfig(loss="cispo")
    with pytest.raises(ValueError, match="--kl-loss-type"):
        PolicyLossConfig(kl_loss_type="k9")
    with pytest.raises(ValueError, match="--eps-clip-c"):
        PolicyLossConfig(eps_clip_c=0.9)


def test_output_metrics_are_detached():
    out = compute_policy_loss(_batch(), PolicyLossConfig())
    assert isinstance(out, PolicyLossOutput)
    assert out.loss.requires_grad
    assert all(not v.requires_grad for v in out.metrics.values())
