"""Per-token KL estimators between the policy and a reference policy.

With ``x = logp - ref_logp`` (log-probs of the sampled token under the policy and the reference):

    k1          = x                       unbiased for KL(pi || ref), high variance, can be < 0
    k2          = x**2 / 2                biased, low variance
    k3          = exp(-x) - 1 + x         unbiased, >= 0, low variance
    low_var_kl  = clamp(k3, -10, 10)      k3 with a guard against exploding ratios

Estimators from John Schulman, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html
(the ``low_var_kl`` clamp follows verl/slime). Flags: ``--kl-loss-type`` picks the estimator,
``--use-unbiased-kl`` applies :func:`unbiased_kl`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LOW_VAR_KL_CLAMP = 10.0


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.square() / 2.0


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # exp(-x) - 1 + x == ref/pi - 1 - log(ref/pi); >= 0 for every x.
    return torch.expm1(-log_ratio) + log_ratio


def _low_var_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    return _k3(log_ratio).clamp(min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "low_var_kl": _low_var_kl,
}


def approx_kl(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate; ``logp`` and ``ref_logp`` share any shape (usually [B, T]).

    Computed in float32 at least, so bf16 log-probs do not lose the small differences.
    Raises ValueError for an unknown ``kind`` (``--kl-loss-type``).
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r} (--kl-loss-type); choose one of {sorted(KL_ESTIMATORS)}")
    if logp.shape != ref_logp.shape:
        raise ValueError(f"approx_kl: logp shape {tuple(logp.shape)} != ref_logp shape {tuple(ref_logp.shape)}")
    dtype = torch.promote_types(logp.dtype, torch.float32)
    log_ratio = logp.to(dtype) - ref_logp.to(dtype)
    return KL_ESTIMATORS[kind](log_ratio)


def unbiased_kl(kl: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Importance-correct a KL estimate computed on samples from the old policy (``--use-unbiased-kl``).

    The tokens were sampled from pi_old, so ``E_old[(pi / pi_old) * k]`` is the unbiased estimate
    of ``E_pi[k]`` (DeepSeek-V3.2 report). Gradients flow through the ratio, as in slime.
    """
    return torch.exp(logp - old_logp) * kl
