"""The trainer's loss plugins: --custom-loss-function-path, --custom-pg-loss-reducer-function-path and
--custom-tis-function-path are loaded, checked and used (relax.backends.trainer.losses)."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import Scores, TrainerSpec
from relax.backends.trainer.losses import MicroLoss, load_loss_plugins
from relax.types import TrainBatch


def half_loss(inputs, cfg):
    """A custom loss: half the built-in one, plus a metric of its own."""
    from relax.algorithms.policy_loss import compute_policy_loss

    out = compute_policy_loss(inputs, cfg)
    return out.loss * 0.5, {"custom_metric": torch.tensor(7.0)}


def mean_reducer(mask_BT, *, per_token_loss, num_global_samples, num_global_tokens):
    return lambda values_BT: (values_BT * mask_BT).sum() / mask_BT.sum()


def constant_tis(logp_old, logp_rollout, *, clip, clip_low):
    return torch.full_like(logp_old, 0.5)


def no_arguments():
    """Not a loss: the wrong signature."""


def test_loss_plugins_are_loaded_and_used():
    spec = TrainerSpec(model_path="unused", loss=PolicyLossConfig(use_tis=True),
                       custom_loss_path=f"{__name__}.half_loss",
                       pg_loss_reducer_path=f"{__name__}.mean_reducer", tis_path=f"{__name__}.constant_tis")
    loss_fn, reducer_factory = load_loss_plugins(spec)
    assert loss_fn is half_loss and reducer_factory is mean_reducer and spec.loss.tis_fn is constant_tis


def test_custom_tis_function_replaces_the_weights():
    from relax.algorithms.policy_loss import PolicyLossInputs, compute_policy_loss

    logp = torch.zeros(1, 2)
    inputs = PolicyLossInputs(logp=logp.clone().requires_grad_(), old_logp=logp, advantages=torch.ones(1, 2),
                              mask_BT=torch.ones(1, 2), num_global_samples=1, rollout_logp=logp)
    plain = compute_policy_loss(inputs, PolicyLossConfig(use_tis=True))
    halved = compute_policy_loss(inputs, PolicyLossConfig(use_tis=True, tis_fn=constant_tis))
    assert float(halved.metrics["pg_loss"]) == pytest.approx(0.5 * float(plain.metrics["pg_loss"]))
    assert float(halved.metrics["tis"]) == pytest.approx(0.5)


def test_wrong_custom_loss_signature_is_named():
    from relax.utils.plugins import PluginError

    spec = TrainerSpec(model_path="unused", loss=PolicyLossConfig(), custom_loss_path=f"{__name__}.no_arguments")
    with pytest.raises(PluginError, match="--custom-loss-function-path"):
        load_loss_plugins(spec)


def rows() -> TrainBatch:
    return TrainBatch(tokens_RL=[[1, 2, 3], [1, 2, 3, 4]], response_lengths_R=[1, 2], loss_masks_RT=[[1], [1, 0]],
                      advantages_RT=[[1.0], [2.0, 3.0]], old_log_probs_RT=[[-1.0], [-1.0, -1.0]],
                      values_RT=[[0.5], [0.5, 0.5]], returns_RT=[[1.0], [0.0, 0.0]])


def test_a_micro_batch_loss_follows_the_head_and_masks_padding():
    """An "lm" head trains on the policy loss, a "value" head on the value loss; padded response
    slots and loss-masked tokens carry nothing."""
    scores = Scores(values_BT=torch.tensor([[-1.0, 0.0], [-1.0, -1.0]], requires_grad=True),
                    mask_BT=torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
    policy = MicroLoss(TrainerSpec(model_path="unused", loss=PolicyLossConfig()), torch.device("cpu"))
    out = policy(rows(), [0, 1], scores, num_samples=2, num_tokens=2.0)
    assert float(out.metrics["ppo_kl"]) == pytest.approx(0.0) and "pg_loss" in out.metrics
    out.loss.backward()
    assert scores.values_BT.grad[0, 1] == 0 and scores.values_BT.grad[1, 1] == 0  # padding, masked token
    value = MicroLoss(TrainerSpec(model_path="unused", head="value"), torch.device("cpu"))
    out = value(rows(), [0, 1], Scores(torch.tensor([[0.5, 0.0], [0.5, 0.5]]), scores.mask_BT), num_samples=2,
                num_tokens=2.0)
    # per sample: masked token mean of the clipped squared error 0.5 * (0.5 - return)^2, over 2 samples
    assert float(out.metrics["value_loss"]) == pytest.approx((0.125 + 0.125) / 2)
