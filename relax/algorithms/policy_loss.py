"""The one policy-loss entry point a training backend calls per micro-batch.

    out = compute_policy_loss(PolicyLossInputs(...), PolicyLossConfig(...))
    out.loss.backward()                     # already divided by the GLOBAL normaliser
    metrics = out.metrics                   # SUM over micro-batches and ranks, except the keys
                                            # in out.reduce_ops ("max" / "min")

Pipeline (slime's ``policy_loss_function`` order):

    1. per-token policy loss from ``POLICY_LOSSES[cfg.loss]`` (ppo | gspo | sapo)
    2. OPSM: zero the loss of dropped sequences             (--use-opsm)
    3. TIS: multiply by clamp(exp(old - rollout))           (--use-tis)
    4. reduce with the global normaliser: per-sample mean, or per token
       (--calculate-per-token-loss); an optional custom pg-loss reducer replaces it for pg_loss only
    5. loss = pg_loss - entropy_coef * entropy + kl_loss_coef * kl_loss

All inputs are [B, T], response-aligned and right-padded, with ``mask_BT``. ``old_logp`` is the
log-prob the advantages were computed against (the trainer's recomputed log-prob, or the
rollout's with --use-rollout-logprobs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from relax.algorithms.kl import KL_ESTIMATORS, approx_kl, unbiased_kl
from relax.algorithms.losses import POLICY_LOSSES, opsm_mask, tis_weights
from relax.algorithms.reducers import GlobalNormalisers

Reducer = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class PolicyLossInputs(GlobalNormalisers):
    """One micro-batch; every tensor is [B, T] and aligned with ``mask_BT``. ``num_global_samples`` /
    ``num_global_tokens`` (keyword-only): the global batch's counts, from :class:`GlobalNormalisers`."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask_BT: torch.Tensor
    ref_logp: torch.Tensor | None = None
    rollout_logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


@dataclass
class PolicyLossConfig:
    """Loss settings; each field names the flag it comes from (defaults are the flags' defaults)."""

    loss: str = "ppo"  # ppo | gspo | sapo (gspo / sapo follow --advantage-estimator)
    eps_clip: float = 0.2  # --eps-clip
    eps_clip_high: float | None = None  # --eps-clip-high (None = eps_clip)
    eps_clip_c: float | None = None  # --eps-clip-c (dual clip, > 1)
    sapo_tau_pos: float = 1.0  # --sapo-tau-pos
    sapo_tau_neg: float = 1.05  # --sapo-tau-neg
    use_kl_loss: bool = False  # --use-kl-loss
    kl_loss_coef: float = 0.0  # --kl-loss-coef
    kl_loss_type: str = "k1"  # --kl-loss-type
    use_unbiased_kl: bool = False  # --use-unbiased-kl
    entropy_coef: float = 0.0  # --entropy-coef
    per_token_loss: bool = False  # --calculate-per-token-loss
    use_tis: bool = False  # --use-tis
    tis_clip: float = 2.0  # --tis-clip
    tis_clip_low: float = 0.0  # --tis-clip-low
    use_opsm: bool = False  # --use-opsm
    opsm_delta: float = 1e-4  # --opsm-delta
    use_rollout_logprobs: bool = False  # --use-rollout-logprobs (compare logp, not old_logp, to rollout)
    # Built by the caller from --custom-pg-loss-reducer-function-path; reduces pg_loss only.
    pg_loss_reducer: Reducer | None = field(default=None, repr=False)
    # --custom-tis-function-path: replaces tis_weights, same signature
    # fn(logp_old, logp_rollout, *, clip, clip_low) -> weights (detached).
    tis_fn: Callable[..., torch.Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.loss not in POLICY_LOSSES:
            raise ValueError(f"unknown policy loss {self.loss!r}; choose one of {sorted(POLICY_LOSSES)}")
        if self.kl_loss_type not in KL_ESTIMATORS:
            raise ValueError(f"unknown --kl-loss-type {self.kl_loss_type!r}; choose one of {sorted(KL_ESTIMATORS)}")
        if self.eps_clip_c is not None and not self.eps_clip_c > 1.0:
            raise ValueError(f"--eps-clip-c must be > 1.0 for dual-clip PPO, got {self.eps_clip_c}")


@dataclass
class PolicyLossOutput:
    """``loss``: scalar to backprop. ``metrics``: detached scalars, each already divided by the
    global normaliser, so SUM reduces them over micro-batches and ranks; ``reduce_ops`` names
    the keys that must be reduced with max or min instead."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]
    reduce_ops: dict[str, str] = field(default_factory=dict)


# How each POLICY_LOSSES entry takes its settings; keys must match POLICY_LOSSES.
_PG_LOSS_KWARGS: dict[str, Callable[[PolicyLossConfig, torch.Tensor], dict]] = {
    "ppo": lambda cfg, mask_BT: {"eps_clip": cfg.eps_clip, "eps_clip_high": cfg.eps_clip_high,
                                 "eps_clip_c": cfg.eps_clip_c},
    "gspo": lambda cfg, mask_BT: {"mask_BT": mask_BT, "eps_clip": cfg.eps_clip, "eps_clip_high": cfg.eps_clip_high},
    "sapo": lambda cfg, mask_BT: {"tau_pos": cfg.sapo_tau_pos, "tau_neg": cfg.sapo_tau_neg},
}
if set(_PG_LOSS_KWARGS) != set(POLICY_LOSSES):
    raise ImportError(f"policy_loss: settings for {sorted(_PG_LOSS_KWARGS)} != POLICY_LOSSES {sorted(POLICY_LOSSES)}")


def _validate(batch: PolicyLossInputs, cfg: PolicyLossConfig) -> None:
    expected = tuple(batch.mask_BT.shape)
    if len(expected) != 2:
        raise ValueError(f"mask_BT must be [B, T], got shape {expected}")
    for name in ("logp", "old_logp", "advantages", "ref_logp", "rollout_logp", "entropy"):
        tensor = getattr(batch, name)
        if tensor is not None and tuple(tensor.shape) != expected:
            raise ValueError(f"PolicyLossInputs.{name} has shape {tuple(tensor.shape)}, expected {expected} "
                             "(the shape of mask_BT; pad every per-token column to the same [B, T])")
    if cfg.use_kl_loss and batch.ref_logp is None:
        raise ValueError("--use-kl-loss needs reference log-probs (PolicyLossInputs.ref_logp); set --ref-load")
    if cfg.use_tis and batch.rollout_logp is None:
        raise ValueError("--use-tis needs rollout log-probs (PolicyLossInputs.rollout_logp) from the engine")
    if cfg.entropy_coef != 0.0 and batch.entropy is None:
        raise ValueError("--entropy-coef is non-zero but PolicyLossInputs.entropy is missing; compute it with "
                         "relax.algorithms.losses.entropy_from_logits")


def _mismatch_metrics(
    logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor, mask_BT: torch.Tensor, reduce: Reducer
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Train-vs-rollout log-prob mismatch: mean via the global reducer, max/min over masked tokens."""
    diff_BT = (logp_BT.detach().float() - rollout_logp_BT.float())
    abs_diff_BT = diff_BT.abs()
    ratio_BT = torch.exp(diff_BT)
    valid_BT = mask_BT.bool()
    inf = torch.tensor(float("inf"), device=diff_BT.device)
    metrics = {
        "train_rollout_logprob_abs_diff_mean": reduce(abs_diff_BT),
        "train_rollout_logprob_abs_diff_max": torch.where(valid_BT, abs_diff_BT, 0.0).max(),
        "train_rollout_importance_ratio_mean": reduce(ratio_BT),
        "train_rollout_importance_ratio_max": torch.where(valid_BT, ratio_BT, 0.0).max(),
        "train_rollout_importance_ratio_min": torch.where(valid_BT, ratio_BT, inf).min(),
    }
    ops = {k: ("min" if k.endswith("_min") else "max") for k in metrics if k.endswith(("_max", "_min"))}
    return metrics, ops


def _kl_loss(batch: PolicyLossInputs, cfg: PolicyLossConfig, reduce: Reducer) -> torch.Tensor:
    # With a zero coefficient the KL is a metric only: detach so no graph is kept for it.
    with_grad = cfg.kl_loss_coef != 0.0
    logp = batch.logp if with_grad else batch.logp.detach()
    kl_BT = approx_kl(logp, batch.ref_logp, cfg.kl_loss_type)
    if cfg.use_unbiased_kl:
        kl_BT = unbiased_kl(kl_BT, logp, batch.old_logp.detach())
    return reduce(kl_BT)


def compute_policy_loss(batch: PolicyLossInputs, cfg: PolicyLossConfig) -> PolicyLossOutput:
    """Policy loss and metrics for one micro-batch (see the module docstring for the pipeline)."""
    _validate(batch, cfg)
    mask_BT = batch.mask_BT
    reduce = batch.reducer(mask_BT, per_token_loss=cfg.per_token_loss)
    old_logp = batch.old_logp.detach()
    advantages = batch.advantages.detach()

    loss_kwargs = _PG_LOSS_KWARGS[cfg.loss](cfg, mask_BT)
    pg_loss_BT, stats = POLICY_LOSSES[cfg.loss](batch.logp, old_logp, advantages, **loss_kwargs)
    metrics: dict[str, torch.Tensor] = {}
    reduce_ops: dict[str, str] = {}

    if cfg.use_opsm:
        keep_BT = opsm_mask(batch.logp.detach(), old_logp, advantages, mask_BT, delta=cfg.opsm_delta)
        pg_loss_BT = pg_loss_BT * keep_BT
        metrics["opsm_clipfrac"] = reduce(1.0 - keep_BT)
    if cfg.use_tis:
        # Weights compare the trainer's old log-prob with the engine's (slime's vanilla TIS).
        weights_BT = (cfg.tis_fn or tis_weights)(old_logp, batch.rollout_logp, clip=cfg.tis_clip,
                                                 clip_low=cfg.tis_clip_low).detach()
        raw_ratio_BT = torch.exp(old_logp.float() - batch.rollout_logp.float())
        pg_loss_BT = pg_loss_BT * weights_BT
        metrics["tis"] = reduce(weights_BT)
        metrics["tis_clipfrac"] = reduce((weights_BT != raw_ratio_BT).float())

    pg_loss = (cfg.pg_loss_reducer or reduce)(pg_loss_BT)
    entropy = reduce(batch.entropy) if batch.entropy is not None else pg_loss.new_zeros(())
    kl_loss = _kl_loss(batch, cfg, reduce) if cfg.use_kl_loss else pg_loss.new_zeros(())

    loss = pg_loss - cfg.entropy_coef * entropy
    if cfg.use_kl_loss and cfg.kl_loss_coef != 0.0:
        loss = loss + cfg.kl_loss_coef * kl_loss

    metrics.update({
        "loss": loss,
        "pg_loss": pg_loss,
        "pg_clipfrac": reduce(stats["clipfrac"]),
        "ppo_kl": reduce(old_logp.float() - batch.logp.detach().float()),
        "kl_loss": kl_loss,
        "entropy": entropy,
    })
    if "dual_clipfrac" in stats:
        metrics["pg_dual_clipfrac"] = reduce(stats["dual_clipfrac"])
    if batch.rollout_logp is not None:
        compared = batch.logp if cfg.use_rollout_logprobs else old_logp
        mismatch, ops = _mismatch_metrics(compared, batch.rollout_logp, mask_BT, reduce)
        metrics.update(mismatch)
        reduce_ops.update(ops)
    return PolicyLossOutput(loss=loss, metrics={k: v.detach() for k, v in metrics.items()}, reduce_ops=reduce_ops)


def combine_metrics(per_micro_batch: list[dict[str, torch.Tensor]], reduce_ops: dict[str, str]) -> dict[str, float]:
    """Reduce metrics of several micro-batches (one rank): sum, or max/min for keys in ``reduce_ops``.

    Across ranks use the same op per key (all_reduce SUM / MAX / MIN).
    """
    combined: dict[str, float] = {}
    for metrics in per_micro_batch:
        for key, value in metrics.items():
            v = float(value)
            if key not in combined:
                combined[key] = v
            elif reduce_ops.get(key) == "max":
                combined[key] = max(combined[key], v)
            elif reduce_ops.get(key) == "min":
                combined[key] = min(combined[key], v)
            else:
                combined[key] += v
    return combined
