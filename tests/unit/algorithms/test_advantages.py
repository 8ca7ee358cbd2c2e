"""Advantage estimators against hand-computed numbers and hand-unrolled loops."""

import math

import pytest
import torch

from relax.algorithms.advantages import (
    ESTIMATORS,
    AdvantageInputs,
    apply_opd_penalty,
    broadcast_to_tokens,
    compute_advantages,
    gae,
    grpo,
    last_token_index,
    normalize_advantages,
    outcome_token_rewards,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    whiten,
)

# ----------------------------------------------------------------------------- grpo


def test_grpo_one_correct_of_four():
    out = grpo(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[1.5, -0.5, -0.5, -0.5]]))


def test_grpo_single_sample_group_is_zero():
    out = grpo(torch.tensor([[0.7], [3.0]]))
    assert out.tolist() == [[0.0], [0.0]]


def test_grpo_constant_group_is_zero_not_nan():
    out = grpo(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert not torch.isnan(out).any()
    assert out.abs().max().item() == 0.0


def test_dr_grpo_only_subtracts_the_group_mean():
    out = grpo(torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 4.0, 0.0, 2.0]]), std_normalization=False)
    torch.testing.assert_close(out, torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.0, 2.0, -2.0, 0.0]]))


def test_grpo_groups_are_independent_and_use_unbiased_std():
    out = grpo(torch.tensor([[1.0, 3.0], [10.0, 10.0]]))
    # group 0: mean 2, unbiased std sqrt(2)
    expected = torch.tensor([[-1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6)], [0.0, 0.0]])
    torch.testing.assert_close(out, expected)


# ----------------------------------------------------------------------------- gae


def _gae_by_hand(rewards, values, gamma, lambd):
    """Plain python GAE on one unpadded sequence."""
    advantages, last = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        last = rewards[t] + gamma * next_value - values[t] + gamma * lambd * last
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values)]


def test_gae_hand_numbers():
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3),
                   gamma=0.9, lambd=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.21712, 0.246, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.71712, 0.846, 1.0]]))


def test_gae_matches_hand_unrolled_loop_on_padded_batch():
    torch.manual_seed(0)
    lengths = [5, 2, 4]
    rewards_BT, values_BT = torch.randn(3, 5), torch.randn(3, 5)
    mask_BT = torch.zeros(3, 5)
    for b, n in enumerate(lengths):
        mask_BT[b, :n] = 1
    adv_BT, ret_BT = gae(rewards_BT, values_BT, mask_BT, gamma=0.95, lambd=0.7)
    for b, n in enumerate(lengths):
        adv, ret = _gae_by_hand(rewards_BT[b, :n].tolist(), values_BT[b, :n].tolist(), 0.95, 0.7)
        torch.testing.assert_close(adv_BT[b, :n], torch.tensor(adv))
        torch.testing.assert_close(ret_BT[b, :n], torch.tensor(ret))
        assert adv_BT[b, n:].abs().sum().item() == 0.0 and ret_BT[b, n:].abs().sum().item() == 0.0


def test_gae_with_gamma_lambda_one_and_zero_values_is_reward_to_go():
    adv, _ = gae(torch.tensor([[1.0, 2.0, 3.0]]), torch.zeros(1, 3), torch.ones(1, 3), gamma=1.0, lambd=1.0)
    torch.testing.assert_close(adv, torch.tensor([[6.0, 5.0, 3.0]]))


def test_gae_skips_interior_masked_positions():
    adv, _ = gae(torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.7]]),
                 torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.9, lambd=0.8)
    # the masked step is invisible: t0 sees V(next) = 0.7 and A(next) = 0.3
    torch.testing.assert_close(adv, torch.tensor([[0.13 + 0.72 * 0.3, 0.0, 0.3]]))


# ----------------------------------------------------------------------------- reinforce++


def test_reinforce_plus_plus_discounted_returns():
    rewards_BT = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # 7.0 sits on padding
    out = reinforce_plus_plus(rewards_BT, mask_BT, gamma=0.5)
    torch.testing.assert_close(out, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))


def test_reinforce_plus_plus_baseline_centres_then_whitens():
    rewards_GN = torch.tensor([[1.0, 0.0], [3.0, 3.0]])
    out = reinforce_plus_plus_baseline(rewards_GN, torch.ones(4, 2))
    # tokens .5 .5 -.5 -.5 0 0 0 0: mean 0, unbiased var 1/7 -> scale sqrt(7)
    s = 0.5 * math.sqrt(7.0)
    torch.testing.assert_close(out, torch.tensor([[s, s], [-s, -s], [0.0, 0.0], [0.0, 0.0]]), atol=1e-5, rtol=1e-5)


def test_reinforce_plus_plus_baseline_subtracts_kl_before_whitening():
    rewards_GN = torch.tensor([[1.0, 0.0]])
    kl_BT = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    out = reinforce_plus_plus_baseline(rewards_GN, torch.ones(2, 2), kl_BT=kl_BT, kl_coef=0.5)
    raw = torch.tensor([[0.5, 0.0], [-0.5, -0.5]])
    expected = (raw - raw.mean()) / raw.std(unbiased=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- helpers


def test_broadcast_to_tokens_zeroes_padding():
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_whiten_uses_only_masked_entries():
    out = whiten(torch.tensor([[1.0, 2.0], [3.0, 100.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-6, rtol=1e-6)


def test_whiten_without_mean_shift_keeps_the_mean():
    out = whiten(torch.tensor([1.0, 2.0, 3.0]), torch.ones(3), shift_mean=False)
    torch.testing.assert_close(out, torch.tensor([1.0, 2.0, 3.0]), atol=1e-6, rtol=1e-6)


def test_normalize_advantages_gives_zero_mean_unit_variance_on_masked_tokens():
    torch.manual_seed(0)
    adv_BT = 3 * torch.randn(4, 6) + 2
    mask_BT = (torch.rand(4, 6) > 0.3).float()
    out = normalize_advantages(adv_BT, mask_BT)
    valid = out[mask_BT.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert valid.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-4)
    assert out[~mask_BT.bool()].abs().sum().item() == 0.0


def test_last_token_index_and_outcome_rewards():
    mask_BT = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    assert last_token_index(mask_BT).tolist() == [1, 2, -1]
    out = outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask_BT, kl_BT=torch.ones(3, 3), kl_coef=0.1)
    torch.testing.assert_close(out, torch.tensor([[-0.1, 0.9, 0.0], [-0.1, 0.0, 1.9], [0.0, 0.0, 0.0]]))


def test_opd_penalty_subtracts_reverse_kl():
    out = apply_opd_penalty(torch.ones(1, 2), torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]),
                            torch.tensor([[1.0, 0.0]]), coef=2.0)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0]]))


# ----------------------------------------------------------------------------- registry


def test_registry_covers_every_estimator_name():
    assert {"grpo", "gspo", "sapo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"} <= set(ESTIMATORS)


@pytest.mark.parametrize("name", ["grpo", "gspo", "sapo"])
def test_grpo_family_estimators_broadcast_group_advantages(name):
    mask_BT = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    inputs = AdvantageInputs(rewards_B=torch.tensor([1.0, 0.0, 0.0, 0.0]), n_samples_per_prompt=4, mask_BT=mask_BT)
    adv, ret = compute_advantages(name, inputs)
    torch.testing.assert_close(adv, torch.tensor([[1.5, 1.5], [-0.5, 0.0], [-0.5, -0.5], [-0.5, -0.5]]))
    torch.testing.assert_close(ret, adv)


def test_disable_rewards_normalization_uses_raw_rewards():
    inputs = AdvantageInputs(rewards_B=torch.tensor([0.3, 0.9]), n_samples_per_prompt=2, mask_BT=torch.ones(2, 2),
                             normalize_rewards=False)
    adv, _ = compute_advantages("grpo", inputs)
    torch.testing.assert_close(adv, torch.tensor([[0.3, 0.3], [0.9, 0.9]]))


def test_kl_coef_shapes_sequence_reward_before_group_normalisation():
    inputs = AdvantageInputs(rewards_B=torch.tensor([1.0, 0.0]), n_samples_per_prompt=2, mask_BT=torch.ones(2, 2),
                             kl_BT=torch.tensor([[0.0, 0.0], [1.0, 1.0]]), kl_coef=0.5, std_normalization=False)
    adv, _ = compute_advantages("grpo", inputs)
    # shaped rewards 1 and -1 -> centred 1 and -1
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))


def test_kl_coef_without_kl_tensor_is_a_clear_error():
    inputs = AdvantageInputs(rewards_B=torch.ones(2), n_samples_per_prompt=2, mask_BT=torch.ones(2, 2), kl_coef=0.1)
    with pytest.raises(ValueError, match="--kl-coef"):
        compute_advantages("grpo", inputs)


def test_ppo_estimator_runs_gae_on_last_token_reward_minus_kl():
    inputs = AdvantageInputs(rewards_B=torch.tensor([1.0]), n_samples_per_prompt=1, mask_BT=torch.ones(1, 3),
                             values_BT=torch.tensor([[0.5, 0.6, 0.7]]), kl_BT=torch.ones(1, 3), kl_coef=0.1,
                             gamma=0.9, lambd=0.8)
    adv, ret = compute_advantages("ppo", inputs)
    exp_adv, exp_ret = _gae_by_hand([-0.1, -0.1, 0.9], [0.5, 0.6, 0.7], 0.9, 0.8)
    torch.testing.assert_close(adv, torch.tensor([exp_adv]))
    torch.testing.assert_close(ret, torch.tensor([exp_ret]))


def test_ppo_estimator_without_values_names_the_fix():
    inputs = AdvantageInputs(rewards_B=torch.ones(1), n_samples_per_prompt=1, mask_BT=torch.ones(1, 2))
    with pytest.raises(ValueError, match="critic"):
        compute_advantages("ppo", inputs)


def test_reinforce_plus_plus_estimator_whitens_discounted_returns():
    mask_BT = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    inputs = AdvantageInputs(rewards_B=torch.tensor([1.0, 0.0]), n_samples_per_prompt=1, mask_BT=mask_BT, gamma=1.0)
    adv, ret = compute_advantages("reinforce_plus_plus", inputs)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    # masked returns 1, 1, 0: mean 2/3, unbiased std sqrt(1/3)
    hi, lo = (1 - 2 / 3) / math.sqrt(1 / 3), (0 - 2 / 3) / math.sqrt(1 / 3)
    torch.testing.assert_close(adv, torch.tensor([[hi, hi], [lo, 0.0]]), atol=1e-5, rtol=1e-5)


def test_unknown_estimator_lists_the_choices():
    inputs = AdvantageInputs(rewards_B=torch.ones(2), n_samples_per_prompt=2, mask_BT=torch.ones(2, 2))
    with pytest.raises(ValueError, match="--advantage-estimator"):
        compute_advantages("a2c", inputs)


def test_rewards_not_divisible_into_groups_is_rejected():
    inputs = AdvantageInputs(rewards_B=torch.ones(3), n_samples_per_prompt=2, mask_BT=torch.ones(3, 2))
    with pytest.raises(ValueError, match="n-samples-per-prompt"):
        compute_advantages("grpo", inputs)


def test_normalize_flag_whitens_estimator_output():
    inputs = AdvantageInputs(rewards_B=torch.tensor([1.0, 0.0, 5.0, 1.0]), n_samples_per_prompt=2,
                             mask_BT=torch.ones(4, 3), std_normalization=False)
    adv, _ = compute_advantages("grpo", inputs, normalize=True)
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_batch_estimators_are_exactly_those_that_need_the_whole_batch(estimator):
    """Fully async writes a group's advantages as soon as it is complete unless its estimator is
    in BATCH_ESTIMATORS: per group must equal the whole batch for every other estimator."""
    from relax.algorithms.advantages import BATCH_ESTIMATORS

    torch.manual_seed(0)
    n, groups, width = 4, 3, 6
    lengths = torch.randint(2, width + 1, (groups * n,))
    mask_BT = (torch.arange(width)[None, :] < lengths[:, None]).float()

    def inputs(rows):
        m = mask_BT[rows][:, : int(lengths[rows].max())]
        return AdvantageInputs(rewards_B=rewards_B[rows], n_samples_per_prompt=n, mask_BT=m,
                               kl_BT=kl_BT[rows][:, : m.shape[1]] * m, kl_coef=0.1, gamma=0.99, lambd=0.95,
                               values_BT=values_BT[rows][:, : m.shape[1]] * m)

    rewards_B = torch.randn(groups * n)
    kl_BT, values_BT = torch.rand(groups * n, width) * 0.1, torch.randn(groups * n, width)
    whole, _ = compute_advantages(estimator, inputs(list(range(groups * n))))
    per_group = [compute_advantages(estimator, inputs(list(range(g * n, (g + 1) * n))))[0] for g in range(groups)]
    same = all(torch.allclose(whole[g * n:(g + 1) * n, : pg.shape[1]], pg, atol=1e-6)
               for g, pg in enumerate(per_group))
    assert same == (estimator not in BATCH_ESTIMATORS)
