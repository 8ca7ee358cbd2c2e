"""A micro-batch's loss from its forward's scores: the policy loss for an "lm" head, the clipped
value loss for a "value" head. The math is `relax.algorithms.policy_loss` / `value_loss` (or the
user's `--custom-loss-function-path`); here the batch's per-row columns become the loss's
`[B, T]` inputs, padded to the forward's response width and masked by its real tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from relax.algorithms.policy_loss import PolicyLossInputs, PolicyLossOutput, compute_policy_loss
from relax.algorithms.value_loss import ValueLossInputs, compute_value_loss
from relax.backends.base import Scores, TrainerSpec
from relax.backends.batching import pad_response
from relax.types import TrainBatch
from relax.utils.plugins import load_plugin


def load_loss_plugins(spec: TrainerSpec) -> tuple[Any, Any]:
    """The loss function (built-in or `--custom-loss-function-path`) and an optional pg-loss
    reducer factory; `--custom-tis-function-path` is bound into the loss config."""
    loss_fn, reducer_factory = compute_policy_loss, None
    if spec.custom_loss_path:
        loss_fn = load_plugin(spec.custom_loss_path, flag="--custom-loss-function-path", positional=2,
                              expected="custom_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig)")
    if spec.pg_loss_reducer_path:
        reducer_factory = load_plugin(spec.pg_loss_reducer_path, flag="--custom-pg-loss-reducer-function-path",
                                      positional=1, keywords=("per_token_loss", "num_global_samples",
                                                              "num_global_tokens"),
                                      expected="reducer_factory(mask_BT, *, per_token_loss, num_global_samples, "
                                               "num_global_tokens) -> fn(values_BT) -> scalar")
    if spec.tis_path and spec.loss is not None:
        spec.loss.tis_fn = load_plugin(spec.tis_path, flag="--custom-tis-function-path", positional=2,
                                       keywords=("clip", "clip_low"),
                                       expected="tis(logp_old, logp_rollout, *, clip, clip_low) -> weights")
    return loss_fn, reducer_factory


class MicroLoss:
    """The loss of micro-batches of one optimizer step: `loss(batch, rows, scores)` with the
    step's normalisers (sample count, loss tokens over the data-parallel size)."""

    def __init__(self, spec: TrainerSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self.loss_fn, self.reducer_factory = load_loss_plugins(spec)

    @property
    def entropy_grad(self) -> bool:
        """Entropy is always reported; it carries a gradient only into a loss that can use it."""
        return self.spec.loss is not None and (self.spec.loss.entropy_coef != 0 or bool(self.spec.custom_loss_path))

    def __call__(self, batch: TrainBatch, rows: list[int], scores: Scores, *, num_samples: int,
                 num_tokens: float) -> PolicyLossOutput:
        if self.spec.head == "value":
            return self.value_loss(batch, rows, scores, num_samples=num_samples, num_tokens=num_tokens)
        return self.policy_loss(batch, rows, scores, num_samples=num_samples, num_tokens=num_tokens)

    def _column(self, values_RT: list[list[float]] | None, rows: list[int], width: int) -> torch.Tensor | None:
        return None if values_RT is None else pad_response([values_RT[i] for i in rows], width).to(self.device)

    def policy_loss(self, batch: TrainBatch, rows: list[int], scores: Scores, *, num_samples: int,
                    num_tokens: float) -> PolicyLossOutput:
        cfg, logp_BT = self.spec.loss, scores.values_BT
        width = logp_BT.shape[1]
        loss_mask_BT = self._column(batch.loss_masks_RT, rows, width) * scores.mask_BT
        old_logp_BT = self._column(batch.old_log_probs_RT, rows, width)
        if old_logp_BT is None and self.spec.old_logp_from_training:  # one on-policy pass: the ratio is exactly 1
            old_logp_BT = logp_BT.detach()
        inputs = PolicyLossInputs(
            logp=logp_BT, old_logp=old_logp_BT, advantages=self._column(batch.advantages_RT, rows, width),
            mask_BT=loss_mask_BT, ref_logp=self._column(batch.ref_log_probs_RT, rows, width),
            rollout_logp=self._column(batch.rollout_log_probs_RT, rows, width), entropy=scores.entropy_BT,
            num_global_samples=num_samples, num_global_tokens=num_tokens,
        )
        if self.reducer_factory is not None:
            cfg = dataclasses.replace(cfg, pg_loss_reducer=self.reducer_factory(
                loss_mask_BT, per_token_loss=cfg.per_token_loss, num_global_samples=num_samples,
                num_global_tokens=num_tokens))
        out = self.loss_fn(inputs, cfg)
        if isinstance(out, tuple):  # custom losses may return (loss, metrics)
            out = PolicyLossOutput(loss=out[0], metrics=dict(out[1]))
        return out

    def value_loss(self, batch: TrainBatch, rows: list[int], scores: Scores, *, num_samples: int,
                   num_tokens: float) -> PolicyLossOutput:
        width = scores.values_BT.shape[1]
        inputs = ValueLossInputs(values=scores.values_BT, old_values=self._column(batch.values_RT, rows, width),
                                 returns=self._column(batch.returns_RT, rows, width),
                                 mask_BT=self._column(batch.loss_masks_RT, rows, width) * scores.mask_BT,
                                 num_global_samples=num_samples, num_global_tokens=num_tokens)
        return compute_value_loss(inputs, value_clip=self.spec.value_clip,
                                  per_token_loss=self.spec.optim.calculate_per_token_loss)
