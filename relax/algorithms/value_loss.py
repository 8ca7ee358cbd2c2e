"""The critic's per-micro-batch loss: the clipped value loss, reduced like the policy loss.

    loss = reduce(0.5 * max((V - R)^2, (V_clip - R)^2)),   V_clip = V_old + clip(V - V_old, +-c)

``V`` are the critic's current values, ``V_old`` the values it wrote onto the rows before the
step (the ones GAE used), ``R`` the GAE returns, ``c`` is ``--value-clip`` (PPO arXiv
1707.06347, value clipping as in OpenAI baselines / verl). The reduction is the policy loss's
(per-sample token mean over the global batch, or per token with ``--calculate-per-token-loss``),
so sums over micro-batches and data-parallel ranks give the global mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax.algorithms.losses import value_loss
from relax.algorithms.policy_loss import PolicyLossOutput
from relax.algorithms.reducers import GlobalNormalisers


@dataclass
class ValueLossInputs(GlobalNormalisers):
    """One micro-batch; every tensor is [B, T] and aligned with ``mask_BT``. ``num_global_samples`` /
    ``num_global_tokens`` (keyword-only): the global batch's counts, from :class:`GlobalNormalisers`
    as in the policy loss's inputs."""

    values: torch.Tensor
    old_values: torch.Tensor
    returns: torch.Tensor
    mask_BT: torch.Tensor


def compute_value_loss(batch: ValueLossInputs, *, value_clip: float, per_token_loss: bool = False) -> PolicyLossOutput:
    """Clipped value loss and metrics (``value_loss``, ``value_clipfrac``, ``values_mean``,
    ``returns_mean``), each already divided by the global normaliser."""
    reduce = batch.reducer(batch.mask_BT, per_token_loss=per_token_loss)
    old_BT, returns_BT = batch.old_values.detach().float(), batch.returns.detach().float()
    loss_BT, stats = value_loss(batch.values.float(), old_BT, returns_BT, value_clip=value_clip)
    loss = reduce(loss_BT)
    metrics = {"value_loss": loss.detach(), "value_clipfrac": reduce(stats["clipfrac"]),
               "values_mean": reduce(batch.values.detach().float()), "returns_mean": reduce(returns_BT)}
    return PolicyLossOutput(loss=loss, metrics=metrics)
