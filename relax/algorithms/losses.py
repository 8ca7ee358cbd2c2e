"""Per-token policy and value losses, entropy, and off-policy corrections (TIS, OPSM).

Every loss returns ``(loss, stats)``: the UNREDUCED per-token loss (same shape as its inputs,
usually [B, T]) and a dict of per-token stats tensors (``clipfrac``, ``ratio``, ...), detached.
Reduction over tokens and samples is the caller's job (see ``reducers`` and ``policy_loss``).

Policy losses (``POLICY_LOSSES``):

    ppo   r = exp(logp - old);  loss = max(-A r, -A clip(r, 1 - eps, 1 + eps_high))
          dual clip (eps_c > 1): for A < 0, loss = min(loss, -A eps_c)
          PPO arXiv 1707.06347; dual clip arXiv 1912.09729; eps_high (clip-higher) from DAPO.
    gspo  same clipped objective with the SEQUENCE ratio exp(masked mean_t(logp - old)),
          arXiv 2507.18071; gradients stay per token (GSPO-token form).
    sapo  soft gate instead of a hard clip: loss = -(4 / tau) sigmoid(tau (r - 1)) A,
          tau = tau_pos if A > 0 else tau_neg, arXiv 2511.20347.

Log-ratios are computed in float32 at least, so bf16 log-probs do not round ratios to 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

StatsDict = dict[str, torch.Tensor]


def _float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}; all inputs must have the same [B, T] shape")


@dataclass(frozen=True)
class ClipRange:
    """PPO's clip: ratios outside [1 - eps_clip, 1 + eps_clip_high] stop the gradient; with
    ``eps_clip_c`` (> 1) a negative advantage's loss is also capped at ``-A eps_clip_c``."""

    eps_clip: float
    eps_clip_high: float | None = None  # None: eps_clip (symmetric)
    eps_clip_c: float | None = None  # None: no dual clip

    def __post_init__(self) -> None:
        if self.eps_clip_c is not None and not self.eps_clip_c > 1.0:
            raise ValueError(f"--eps-clip-c must be > 1.0 for dual-clip PPO, got {self.eps_clip_c}")


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, clip: ClipRange
) -> tuple[torch.Tensor, StatsDict]:
    """PPO's clipped objective given log importance ratios; shared by :func:`ppo_clip` and :func:`gspo`."""
    eps_high = clip.eps_clip if clip.eps_clip_high is None else clip.eps_clip_high
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip.eps_clip, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    stats = {"clipfrac": (clipped > unclipped).float(), "ratio": ratio.detach()}
    if clip.eps_clip_c is not None:
        dual_bound = -advantages * clip.eps_clip_c
        dual = torch.minimum(loss, dual_bound)
        stats["dual_clipfrac"] = ((advantages < 0) & (dual_bound < loss)).float()
        loss = torch.where(advantages < 0, dual, loss)
    return loss, stats


def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, StatsDict]:
    """Per-token clipped PPO loss (``--eps-clip``, ``--eps-clip-high``, ``--eps-clip-c``)."""
    _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages)
    log_ratio = _float(logp) - _float(old_logp)
    return clipped_surrogate(log_ratio, advantages, ClipRange(eps_clip, eps_clip_high, eps_clip_c))


def sequence_log_ratio(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Masked mean over each sequence of ``logp - old_logp``: returns [B] (0 for an all-masked row)."""
    mask_BT = mask_BT.to(torch.float32)
    log_ratio_BT = _float(logp_BT) - _float(old_logp_BT)
    return (log_ratio_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)


def gspo(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
) -> tuple[torch.Tensor, StatsDict]:
    """GSPO: the clipped objective on the length-normalised sequence ratio (arXiv 2507.18071).

    The value of every token's ratio is the sequence ratio ``exp(mean_t(logp - old))``; its
    gradient is routed per token via ``logp - logp.detach() + seq_log_ratio.detach()`` (the
    GSPO-token form, as slime does), so token t's loss only differentiates token t's log-prob.
    """
    _check_same_shape(logp=logp_BT, old_logp=old_logp_BT, advantages=advantages_BT, mask=mask_BT)
    seq_log_ratio_B = sequence_log_ratio(logp_BT, old_logp_BT, mask_BT).detach()
    logp32_BT = _float(logp_BT)
    log_ratio_BT = logp32_BT - logp32_BT.detach() + seq_log_ratio_B.unsqueeze(-1)
    return clipped_surrogate(log_ratio_BT, advantages_BT, ClipRange(eps_clip, eps_clip_high))


def sapo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[torch.Tensor, StatsDict]:
    """SAPO soft-gated policy loss (arXiv 2511.20347; ``--sapo-tau-pos``, ``--sapo-tau-neg``).

    ``-(4 / tau) * sigmoid(tau * (r - 1)) * A``: at r = 1 the gradient equals PPO's (-A), and it
    decays smoothly as r leaves 1 instead of dropping to zero at a hard clip boundary.
    """
    _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages)
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    ratio = torch.exp(_float(logp) - _float(old_logp))
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    loss = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * advantages
    # No hard clip, so clipfrac is 0. gate_weight = 4 s (1 - s) is the token's gradient scale
    # relative to PPO's at r = 1 (1 on-policy, -> 0 far off-policy): the soft analogue.
    gate = torch.sigmoid(tau * (ratio - 1.0)).detach()
    stats = {
        "clipfrac": torch.zeros_like(gate),
        "ratio": ratio.detach(),
        "gate_weight": 4.0 * gate * (1.0 - gate),
    }
    return loss, stats


POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, StatsDict]]] = {
    "ppo": ppo_clip,
    "gspo": gspo,
    "sapo": sapo,
}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    value_clip: float,
) -> tuple[torch.Tensor, StatsDict]:
    """Clipped value loss ``0.5 * max((v - R)^2, (v_clip - R)^2)``, ``v_clip = old + clip(v - old, +-c)``.

    ``--value-clip`` is ``c``. PPO arXiv 1707.06347 (value clipping as in OpenAI baselines/verl).
    ``clipfrac`` marks tokens where the clipped term is the larger one.
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns)
    values_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    unclipped = (values - returns).square()
    clipped = (values_clipped - returns).square()
    loss = 0.5 * torch.maximum(unclipped, clipped)
    return loss, {"clipfrac": (clipped > unclipped).float()}


def entropy_from_logits(logits_BTV: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: ``logsumexp(z) - sum(softmax(z) * z)`` -> [B, T].

    Stable for large logits (shifted by the row max before any exp); half-precision inputs are
    computed in float32.
    """
    logits = _float(logits_BTV)
    # Shift by the max first: both terms then stay O(log V) and do not cancel at large magnitude.
    shifted = logits - logits.max(dim=-1, keepdim=True).values.detach()
    probs = F.softmax(shifted, dim=-1)
    return torch.logsumexp(shifted, dim=-1) - (probs * shifted).sum(dim=-1)


def tis_weights(
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    *,
    clip: float = 2.0,
    clip_low: float = 0.0,
) -> torch.Tensor:
    """Truncated importance-sampling weights ``clamp(exp(old - rollout), clip_low, clip)``, detached.

    Corrects for the rollout engine's sampling distribution differing from the trainer's
    (``--use-tis``, ``--tis-clip``, ``--tis-clip-low``). Multiply the per-token policy loss by it.
    """
    _check_same_shape(logp_old=logp_old, logp_rollout=logp_rollout)
    if clip_low > clip:
        raise ValueError(f"--tis-clip-low ({clip_low}) must not exceed --tis-clip ({clip})")
    with torch.no_grad():
        ratio = torch.exp(_float(logp_old) - _float(logp_rollout))
        return ratio.clamp(min=clip_low, max=clip)


def opsm_mask(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    delta: float = 1e-4,
) -> torch.Tensor:
    """Off-Policy Sequence Masking (``--use-opsm``, ``--opsm-delta``): a 0/1 float mask_BT.

    A sequence is dropped (all its tokens 0) when its advantage is negative AND its
    masked-mean ``old_logp - logp`` exceeds ``delta``: a negative update on a sequence the
    policy has already drifted away from is the main source of off-policy instability.
    ``advantages_B`` may also be [B, T]; then the sign test is per token, as slime does.
    Padding positions are 0 in the result (it is the effective loss mask).
    """
    _check_same_shape(logp=logp, old_logp=old_logp, mask=mask_BT)
    with torch.no_grad():
        seq_kl_B = -sequence_log_ratio(logp, old_logp, mask_BT)
        if advantages_B.dim() == 1:
            advantages_B = advantages_B.unsqueeze(-1)
        drop_BT = (advantages_B < 0) & (seq_kl_B.unsqueeze(-1) > delta)
        return (~drop_BT).to(torch.float32) * mask_BT.to(torch.float32)
