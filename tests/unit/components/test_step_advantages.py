"""A step's advantages from its rows (GAE on critic values, OPD penalty, normalisation order) and
the Actor's step timing helpers (critic-only steps, reference refresh)."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.advantages import gae
from relax.components.step_advantages import AdvantageSpec, opd_metrics, step_advantages
from relax.components.training import trains_actor
from relax.config.schema import RelaxConfig


def cfg_with(**algo) -> RelaxConfig:
    return RelaxConfig().replace(n_samples_per_prompt=2, **algo)


def advantages(cfg: RelaxConfig, **extra):
    rows = {"old_log_probs_RT": [[-1.0, -2.0, -0.5], [-1.0, -1.0]],
            "teacher_log_probs_RT": [[-1.5, -1.0, -0.5], [-3.0, -1.0]]} | extra
    return step_advantages(AdvantageSpec.from_config(cfg), [1.0, 0.0], [[1, 1, 1], [1, 1]], **rows)


def test_critic_only_steps_are_the_first_n_rollouts():
    cfg = cfg_with(num_critic_only_steps=2)
    assert [trains_actor(cfg, k) for k in range(4)] == [False, False, True, True]
    assert not any(trains_actor(cfg_with(critic_train_only=True), k) for k in range(4))


def test_ppo_advantages_and_returns_are_gae_on_the_critic_values():
    adv, returns = advantages(cfg_with(advantage_estimator="ppo", gamma=0.9, lambd=0.8),
                              values_RT=[[0.1, 0.2, 0.3], [0.5, 0.4]])
    rewards_BT = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])  # reward at the last response token
    values_BT = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.4, 0.0]])
    mask_BT = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    want_adv, want_ret = gae(rewards_BT, values_BT, mask_BT, gamma=0.9, lambd=0.8)
    assert adv[0] == pytest.approx(want_adv[0].tolist()) and adv[1] == pytest.approx(want_adv[1, :2].tolist())
    assert returns[0] == pytest.approx(want_ret[0].tolist()) and len(returns[1]) == 2


def test_opd_penalty_is_added_to_the_estimator():
    adv, _ = advantages(cfg_with(use_opd=True, opd_kl_coef=0.5))
    grpo = [0.7071, -0.7071]  # (r - mean) / (unbiased std + eps) for rewards [1, 0]
    assert adv[0] == pytest.approx([grpo[0] - 0.5 * 0.5, grpo[0] - 0.5 * -1.0, grpo[0]], abs=1e-3)
    assert adv[1] == pytest.approx([grpo[1] - 0.5 * 2.0, grpo[1]], abs=1e-3)


def test_without_opd_the_teacher_column_changes_nothing():
    with_teacher, _ = advantages(cfg_with())
    assert with_teacher[0] == pytest.approx([0.7071] * 3, abs=1e-3)


def test_advantages_are_normalised_after_the_opd_penalty():
    adv, _ = advantages(cfg_with(use_opd=True, normalize_advantages=True))
    flat = torch.tensor(adv[0] + adv[1])
    assert float(flat.mean()) == pytest.approx(0.0, abs=1e-6) and float(flat.std()) == pytest.approx(1.0, abs=1e-3)


def test_kl_shaping_without_its_columns_is_a_clear_error():
    with pytest.raises(ValueError, match="--kl-coef needs the 'ref_log_probs' column"):
        advantages(cfg_with(kl_coef=0.1))


def test_opd_metrics_ignore_masked_tokens():
    metrics = opd_metrics([[-1.0, -9.0]], [[-2.0, 0.0]], [[1, 0]])
    assert metrics["opd/kl_to_teacher"] == pytest.approx(1.0)
    assert metrics["opd/teacher_log_prob_mean"] == pytest.approx(-2.0)
