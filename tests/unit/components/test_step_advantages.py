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


def test_disable_rewards_normalization_uses_the_raw_rewards_as_advantages():
    normalised, _ = advantages(cfg_with())
    raw, _ = advantages(cfg_with(disable_rewards_normalization=True))
    assert normalised[0][0] == pytest.approx(0.7071, abs=1e-3)  # (r - mean) / std over the group [1, 0]
    assert raw == [pytest.approx([1.0] * 3), pytest.approx([0.0] * 2)]  # the rewards themselves


def test_a_custom_reward_post_process_path_keeps_its_rewards_unnormalised():
    cfg = cfg_with().replace(custom_reward_post_process_path="tests.somewhere.post_process")
    assert not AdvantageSpec.from_config(cfg).normalize_rewards
    assert advantages(cfg)[0] == [pytest.approx([1.0] * 3), pytest.approx([0.0] * 2)]


def test_kl_shaping_without_its_columns_is_a_clear_error():
    with pytest.raises(ValueError, match="--kl-coef needs the 'ref_log_probs' column"):
        advantages(cfg_with(kl_coef=0.1))


def test_opd_metrics_ignore_masked_tokens():
    metrics = opd_metrics([[-1.0, -9.0]], [[-2.0, 0.0]], [[1, 0]])
    assert metrics["opd/kl_to_teacher"] == pytest.approx(1.0)
    assert metrics["opd/teacher_log_prob_mean"] == pytest.approx(-2.0)


def test_prior_segment_rows_share_their_episodes_advantage():
    """Rows 0-1 and 2-3 are two groups of N=2 episodes; rows 4 and 5 are prior segments of the
    episodes in rows 1 and 2 (agent episodes that rewrote their history): the estimator sees the
    four scored rows only, and each segment row carries its episode's value on its own mask."""
    from relax.components.step_advantages import final_rows

    sample_ids, episode_ids = [0, 1, 2, 3, 90, 91], [0, 1, 2, 3, 1, 2]
    final_of = final_rows(sample_ids, episode_ids)
    assert final_of == [0, 1, 2, 3, 1, 2]
    masks = [[1, 1], [1], [1, 1, 1], [1], [0, 1, 1], [1, 0]]
    spec = AdvantageSpec.from_config(cfg_with())
    adv, _ = step_advantages(spec, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], masks, final_of_R=final_of)
    plain, _ = step_advantages(spec, [1.0, 0.0, 0.0, 1.0], masks[:4])
    assert all(a == pytest.approx(b) for a, b in zip(adv[:4], plain))  # the scored rows are as without segments
    assert adv[4] == pytest.approx([0.0, plain[1][0], plain[1][0]]) and adv[5] == pytest.approx([plain[2][0], 0.0])
    assert final_rows(sample_ids[:4], episode_ids[:4]) is None  # every row its own episode
    with pytest.raises(ValueError, match="episode's row is not in the batch"):
        final_rows([0, 90], [0, 1])
    with pytest.raises(ValueError, match="--agent-segments last"):
        step_advantages(AdvantageSpec.from_config(cfg_with(advantage_estimator="reinforce_plus_plus")),
                        [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], masks, final_of_R=final_of)


def test_a_streamed_group_is_complete_with_every_row_of_its_episodes():
    from relax.components.advantages import complete_groups

    def row(group: int, episode: int, rows: int) -> dict:
        return {"group_indices": group, "episode_indices": episode, "episode_rows": rows}

    rows = {"0": row(0, 0, 1), "1": row(0, 1, 2), "2": row(1, 2, 1), "3": row(1, 3, 1)}
    assert complete_groups(rows, 2) == [["2", "3"]]  # group 0 waits for episode 1's prior segment
    rows["99"] = row(0, 1, 2)
    assert complete_groups(rows, 2) == [["0", "1", "99"], ["2", "3"]]
    plain = {k: {"group_indices": v["group_indices"]} for k, v in rows.items() if k != "99"}
    assert complete_groups(plain, 2) == [["0", "1"], ["2", "3"]]  # rows without the episode columns
