"""Advantage estimators: GRPO / Dr.GRPO, GAE (PPO), REINFORCE++ and REINFORCE++-baseline.

Scalar (sequence-level) rewards arrive as ``rewards_B`` with groups contiguous (group g is rows
g*N .. g*N+N-1). Token-level tensors are [B, T], right-padded, with ``mask_BT``. Advantages at
masked positions are 0.

    grpo     A_i = (r_i - mean_g) / (std_g + eps), unbiased std (GRPO, arXiv 2402.03300);
             Dr.GRPO drops the std division (arXiv 2503.20783, --disable-grpo-std-normalization).
             A group of one sample gets 0 (no baseline exists); a constant group gets 0.
    gae      delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lambda A_{t+1};
             returns = A + V (GAE, arXiv 1506.02438). Masked positions are skipped.
    reinforce_plus_plus
             G_t = r_t + gamma G_{t+1} on token rewards (reward at the last token, minus
             kl_coef * KL per token), then batch whitening (REINFORCE++, arXiv 2501.03262).
    reinforce_plus_plus_baseline
             (r_i - group mean) broadcast to tokens, minus kl_coef * KL, then batch whitening.

``ESTIMATORS`` maps each ``--advantage-estimator`` name to a function of one ``AdvantageInputs``
returning ``(advantages_BT, returns_BT)``. Semantics follow slime's ``slime/utils/ppo_utils.py``
and ``slime/backends/megatron_utils/loss.py`` (compute_advantages_and_returns) and verl's
``verl/trainer/ppo/core_algos.py``; differences are noted per function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

WHITEN_EPS = 1e-8


# ----------------------------------------------------------------------------- helpers


def broadcast_to_tokens(adv_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Copy one scalar per sequence onto its tokens: [B] -> [B, T], 0 where the mask is 0."""
    if adv_B.dim() != 1 or adv_B.shape[0] != mask_BT.shape[0]:
        raise ValueError(f"broadcast_to_tokens: adv shape {tuple(adv_B.shape)} does not match mask rows "
                         f"{tuple(mask_BT.shape)}; expected adv [B] and mask [B, T]")
    return adv_B.unsqueeze(-1) * mask_BT.to(adv_B.dtype)


def whiten(
    values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = WHITEN_EPS
) -> torch.Tensor:
    """Masked whitening ``(x - mean) / sqrt(var + eps)`` over all masked entries; 0 elsewhere.

    Mean and variance use only positions where ``mask`` is 1; the variance is unbiased
    (Bessel-corrected) as in verl's ``masked_whiten`` and slime's ``distributed_masked_whiten``.
    ``shift_mean=False`` rescales without centring (adds the mean back). Fewer than two masked
    entries: the values are only centred (variance undefined).
    """
    if values.shape != mask.shape:
        raise ValueError(f"whiten: values shape {tuple(values.shape)} != mask shape {tuple(mask.shape)}")
    maskf = mask.to(values.dtype)
    count = maskf.sum()
    mean = (values * maskf).sum() / count.clamp(min=1)
    centred = (values - mean) * maskf
    if count < 2:
        return centred if shift_mean else values * maskf
    var = centred.square().sum() / (count - 1)
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean * maskf
    return out


def normalize_advantages(adv_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """``--normalize-advantages``: masked whitening of the local batch's token advantages.

    For data-parallel training, whiten over the whole batch BEFORE it is split across ranks
    (the Advantages role sees the whole rollout batch), or the statistics differ per rank.
    """
    return whiten(adv_BT, mask_BT, shift_mean=True)


def _as_groups(rewards_B: torch.Tensor, n_samples_per_prompt: int) -> torch.Tensor:
    if n_samples_per_prompt < 1:
        raise ValueError(f"--n-samples-per-prompt must be >= 1, got {n_samples_per_prompt}")
    if rewards_B.dim() != 1 or rewards_B.shape[0] % n_samples_per_prompt != 0:
        raise ValueError(f"rewards shape {tuple(rewards_B.shape)} is not a flat batch divisible into groups of "
                         f"--n-samples-per-prompt={n_samples_per_prompt}; keep whole groups together")
    return rewards_B.view(-1, n_samples_per_prompt)


def last_token_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """Index of the last position with mask 1 in each row: [B]; -1 for an all-zero row."""
    T = mask_BT.shape[-1]
    positions_BT = torch.arange(T, device=mask_BT.device).expand_as(mask_BT)
    return torch.where(mask_BT.bool(), positions_BT, torch.full_like(positions_BT, -1)).max(dim=-1).values


def outcome_token_rewards(
    rewards_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    kl_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Token rewards ``-kl_coef * kl_t`` with the sequence reward added at the last masked token.

    Slime places the outcome reward on the last loss-mask token (reinforce++) or the last
    response token (ppo); on right-padded batches without a trailing masked segment they agree.
    A row with an all-zero mask receives no reward.
    """
    mask_f = mask_BT.to(torch.float32)
    token_rewards_BT = torch.zeros_like(mask_f)
    if kl_BT is not None and kl_coef != 0.0:
        token_rewards_BT = -kl_coef * kl_BT.to(torch.float32) * mask_f
    last_B = last_token_index(mask_BT)
    has_token_B = last_B >= 0
    rows_B = torch.arange(mask_BT.shape[0], device=mask_BT.device)[has_token_B]
    token_rewards_BT = token_rewards_BT.clone()
    token_rewards_BT[rows_B, last_B[has_token_B]] += rewards_B.to(torch.float32)[has_token_B]
    return token_rewards_BT


# ----------------------------------------------------------------------------- estimators


def grpo(rewards_GN: torch.Tensor, *, std_normalization: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages [G, N] -> [G, N] (GRPO arXiv 2402.03300; Dr.GRPO arXiv 2503.20783).

    ``(r - group mean) / (unbiased group std + eps)``; ``std_normalization=False`` gives
    ``r - group mean`` (``--disable-grpo-std-normalization``). N == 1 gives zeros (a single sample
    is its own mean; no std normalisation). A constant group gives zeros, never NaN.
    """
    if rewards_GN.dim() != 2:
        raise ValueError(f"grpo expects rewards [G, N], got shape {tuple(rewards_GN.shape)}")
    rewards_GN = rewards_GN.to(torch.promote_types(rewards_GN.dtype, torch.float32))
    centred_GN = rewards_GN - rewards_GN.mean(dim=-1, keepdim=True)
    if not std_normalization or rewards_GN.shape[-1] == 1:
        return centred_GN
    std_G1 = rewards_GN.std(dim=-1, unbiased=True, keepdim=True)
    return centred_GN / (std_G1 + eps)


def gae(
    rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    gamma: float,
    lambd: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (arXiv 1506.02438) on masked, right-padded sequences.

    Returns ``(advantages_BT, returns_BT)`` with ``returns = advantages + values``; both are 0 at
    masked positions. The value after the last valid token is 0 (episode ends). Masked
    positions are skipped: the recursion carries V_{t+1} and A_{t+1} across them, as verl's
    ``compute_gae_advantage_return`` does for multi-turn masks (slime, without masks, treats
    every response position as a step; both agree on plain right-padded batches).
    """
    if not (rewards_BT.shape == values_BT.shape == mask_BT.shape):
        raise ValueError(f"gae: rewards {tuple(rewards_BT.shape)}, values {tuple(values_BT.shape)} and mask "
                         f"{tuple(mask_BT.shape)} must share one [B, T] shape")
    with torch.no_grad():
        dtype = torch.promote_types(values_BT.dtype, torch.float32)
        rewards_BT, values_BT = rewards_BT.to(dtype), values_BT.to(dtype)
        mask_BT = mask_BT.to(dtype)
        B, T = rewards_BT.shape
        next_value_B = rewards_BT.new_zeros(B)
        next_adv_B = rewards_BT.new_zeros(B)
        advantages_BT = torch.zeros_like(rewards_BT)
        for t in reversed(range(T)):
            m_B = mask_BT[:, t]
            delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
            adv_B = delta_B + gamma * lambd * next_adv_B
            advantages_BT[:, t] = adv_B * m_B
            next_value_B = m_B * values_BT[:, t] + (1 - m_B) * next_value_B
            next_adv_B = m_B * adv_B + (1 - m_B) * next_adv_B
        returns_BT = (advantages_BT + values_BT) * mask_BT
    return advantages_BT, returns_BT


def reinforce_plus_plus(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """Discounted return per token ``G_t = r_t + gamma * G_{t+1}`` (REINFORCE++, arXiv 2501.03262).

    Rewards at masked positions are ignored; returns at masked positions are 0. Whiten the result
    over the batch (:func:`whiten`) to get REINFORCE++ advantages, as verl's
    ``compute_reinforce_plus_plus_outcome_advantage`` does. Like slime's
    ``get_reinforce_plus_plus_returns``, interior masked positions still count as time steps
    (verl instead restarts the sum at every masked position); padding sits after the last valid
    token and therefore never contributes.
    """
    if token_rewards_BT.shape != mask_BT.shape:
        raise ValueError(f"reinforce_plus_plus: rewards {tuple(token_rewards_BT.shape)} != mask {tuple(mask_BT.shape)}")
    with torch.no_grad():
        mask_f = mask_BT.to(torch.promote_types(token_rewards_BT.dtype, torch.float32))
        rewards_BT = token_rewards_BT.to(mask_f.dtype) * mask_f
        returns_BT = torch.zeros_like(rewards_BT)
        running_B = rewards_BT.new_zeros(rewards_BT.shape[0])
        for t in reversed(range(rewards_BT.shape[1])):
            running_B = rewards_BT[:, t] + gamma * running_B
            returns_BT[:, t] = running_B
    return returns_BT * mask_f


def reinforce_plus_plus_baseline(
    rewards_GN: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    kl_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    subtract_baseline: bool = True,
) -> torch.Tensor:
    """REINFORCE++-baseline advantages [B, T] (arXiv 2501.03262).

    ``r_i - group mean`` (skipped with ``subtract_baseline=False``, i.e.
    ``--disable-rewards-normalization``) broadcast to tokens, minus ``kl_coef * kl_t`` (slime's
    ``get_reinforce_plus_plus_baseline_advantages``), then whitened over the batch (verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``). Rows are groups in order:
    row b of ``mask_BT`` is sample ``b % N`` of group ``b // N``.
    """
    if rewards_GN.dim() != 2 or rewards_GN.numel() != mask_BT.shape[0]:
        raise ValueError(f"reinforce_plus_plus_baseline: rewards {tuple(rewards_GN.shape)} must be [G, N] with "
                         f"G*N == mask rows ({mask_BT.shape[0]})")
    rewards_GN = rewards_GN.to(torch.float32)
    centred_GN = rewards_GN - rewards_GN.mean(dim=-1, keepdim=True) if subtract_baseline else rewards_GN
    adv_BT = broadcast_to_tokens(centred_GN.reshape(-1), mask_BT)
    if kl_BT is not None and kl_coef != 0.0:
        adv_BT = adv_BT - kl_coef * kl_BT.to(torch.float32) * mask_BT.to(torch.float32)
    return whiten(adv_BT, mask_BT)


def apply_opd_penalty(
    adv_BT: torch.Tensor,
    student_logp_BT: torch.Tensor,
    teacher_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    coef: float,
) -> torch.Tensor:
    """On-policy distillation (``--use-opd``, ``--opd-kl-coef``): ``A - coef * (logp_student - logp_teacher)``.

    The per-token reverse-KL penalty is added on top of whatever estimator produced ``adv_BT``
    (slime's ``apply_opd_kl_to_advantages``). Masked positions stay 0.
    """
    reverse_kl_BT = (student_logp_BT.to(torch.float32) - teacher_logp_BT.to(torch.float32)).detach()
    return (adv_BT - coef * reverse_kl_BT) * mask_BT.to(adv_BT.dtype)


# ----------------------------------------------------------------------------- registry


@dataclass
class AdvantageInputs:
    """Everything an estimator may need, for one batch of whole groups.

    rewards_B             sequence rewards [B], groups contiguous (raw rewards; group
                          normalisation happens here unless ``normalize_rewards`` is False)
    n_samples_per_prompt  N (``--n-samples-per-prompt``)
    mask_BT               loss mask [B, T]
    values_BT             critic values [B, T] (``ppo`` only)
    kl_BT                 per-token KL(policy || reference) for reward shaping (``--kl-coef``)
    kl_coef               ``--kl-coef``; 0 disables shaping
    gamma, lambd          ``--gamma``, ``--lambd`` (default 1.0, 1.0)
    std_normalization     False = ``--disable-grpo-std-normalization`` (Dr.GRPO)
    normalize_rewards     False = ``--disable-rewards-normalization``: raw rewards are the advantage
    grpo_eps              epsilon added to the group std
    """

    rewards_B: torch.Tensor
    n_samples_per_prompt: int
    mask_BT: torch.Tensor
    values_BT: torch.Tensor | None = None
    kl_BT: torch.Tensor | None = None
    kl_coef: float = 0.0
    gamma: float = 1.0
    lambd: float = 1.0
    std_normalization: bool = True
    normalize_rewards: bool = True
    grpo_eps: float = 1e-6


def _shaped_sequence_rewards(inputs: AdvantageInputs) -> torch.Tensor:
    """Sequence rewards minus ``kl_coef * sum_t kl_t``: verl's ``apply_kl_penalty`` followed by
    its outcome estimators summing token rewards. No-op when ``kl_coef`` is 0."""
    rewards_B = inputs.rewards_B.to(torch.float32)
    if inputs.kl_coef == 0.0 or inputs.kl_BT is None:
        return rewards_B
    kl_B = (inputs.kl_BT.to(torch.float32) * inputs.mask_BT.to(torch.float32)).sum(-1)
    return rewards_B - inputs.kl_coef * kl_B


def _check_kl(inputs: AdvantageInputs) -> None:
    if inputs.kl_coef != 0.0 and inputs.kl_BT is None:
        raise ValueError("--kl-coef is non-zero but AdvantageInputs.kl_BT is missing; compute the per-token "
                         "KL against the reference model (needs --ref-load) or set --kl-coef 0")


def _grpo_estimator(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    _check_kl(inputs)
    rewards_B = _shaped_sequence_rewards(inputs)
    if inputs.normalize_rewards:
        rewards_GN = _as_groups(rewards_B, inputs.n_samples_per_prompt)
        adv_B = grpo(rewards_GN, std_normalization=inputs.std_normalization, eps=inputs.grpo_eps).reshape(-1)
    else:
        adv_B = rewards_B
    adv_BT = broadcast_to_tokens(adv_B, inputs.mask_BT)
    return adv_BT, adv_BT.clone()


def _ppo_estimator(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    _check_kl(inputs)
    if inputs.values_BT is None:
        raise ValueError("advantage estimator 'ppo' needs critic values (AdvantageInputs.values_BT); "
                         "deploy a critic or pick --advantage-estimator grpo")
    token_rewards_BT = outcome_token_rewards(inputs.rewards_B, inputs.mask_BT, kl_BT=inputs.kl_BT,
                                             kl_coef=inputs.kl_coef)
    return gae(token_rewards_BT, inputs.values_BT, inputs.mask_BT, gamma=inputs.gamma, lambd=inputs.lambd)


def _reinforce_pp_estimator(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    _check_kl(inputs)
    token_rewards_BT = outcome_token_rewards(inputs.rewards_B, inputs.mask_BT, kl_BT=inputs.kl_BT,
                                             kl_coef=inputs.kl_coef)
    returns_BT = reinforce_plus_plus(token_rewards_BT, inputs.mask_BT, gamma=inputs.gamma)
    return whiten(returns_BT, inputs.mask_BT), returns_BT


def _reinforce_pp_baseline_estimator(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    _check_kl(inputs)
    rewards_GN = _as_groups(inputs.rewards_B.to(torch.float32), inputs.n_samples_per_prompt)
    adv_BT = reinforce_plus_plus_baseline(rewards_GN, inputs.mask_BT, kl_BT=inputs.kl_BT, kl_coef=inputs.kl_coef,
                                          subtract_baseline=inputs.normalize_rewards)
    return adv_BT, adv_BT.clone()


ESTIMATORS: dict[str, Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]] = {
    "grpo": _grpo_estimator,
    "gspo": _grpo_estimator,
    "sapo": _grpo_estimator,
    # OPD is independent of the estimator (--use-opd / --opd-kl-coef, see apply_opd_penalty);
    # the name stays accepted for compatibility and uses the GRPO advantage.
    "on_policy_distillation": _grpo_estimator,
    "reinforce_plus_plus": _reinforce_pp_estimator,
    "reinforce_plus_plus_baseline": _reinforce_pp_baseline_estimator,
    "ppo": _ppo_estimator,
}


# Estimators that whiten over the whole batch: a group's advantages depend on every other row.
BATCH_ESTIMATORS = frozenset({"reinforce_plus_plus", "reinforce_plus_plus_baseline"})
# Estimators that give one advantage per sample (broadcast over its tokens) when --kl-coef is 0: an
# episode's prior segments can share it (Sample.prior_segments, --agent-segments).
SEQUENCE_ESTIMATORS = frozenset({"grpo", "gspo", "sapo", "on_policy_distillation"})


def compute_advantages(
    estimator: str,
    inputs: AdvantageInputs,
    *,
    normalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Look up ``--advantage-estimator`` in ``ESTIMATORS`` and run it; ``normalize`` is
    ``--normalize-advantages`` (masked whitening of the advantages; returns are unchanged)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown --advantage-estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}")
    if inputs.rewards_B.shape[0] != inputs.mask_BT.shape[0]:
        raise ValueError(f"rewards_B has {inputs.rewards_B.shape[0]} rows but mask_BT has {inputs.mask_BT.shape[0]}")
    advantages_BT, returns_BT = ESTIMATORS[estimator](inputs)
    if normalize:
        advantages_BT = normalize_advantages(advantages_BT, inputs.mask_BT)
    return advantages_BT, returns_BT
