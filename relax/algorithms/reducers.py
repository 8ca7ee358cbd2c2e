"""Loss reduction over tokens, micro-batches and data-parallel ranks.

A training step sees one GLOBAL batch split into micro-batches on several data-parallel ranks.
Each reducer here turns a per-token tensor of ONE micro-batch into a scalar that is already
divided by a GLOBAL normaliser, so that summing the scalars over all micro-batches and ranks
(gradient accumulation + all-reduce SUM) gives exactly the global average:

    sum_of_sample_mean (default)       sum over local samples of (masked token mean of the
                                       sample), divided by the number of samples in the global
                                       batch. Every sample weighs the same whatever its length.
    per_token_sum                      masked token sum divided by the global batch's number of
    (--calculate-per-token-loss)       loss tokens. Every token weighs the same (Dr.GRPO-style).

A sample whose mask is all zero contributes 0 (its denominator is clamped to 1), never NaN.
Both losses' inputs (policy and value) carry the two global counts as `GlobalNormalisers` fields
and reduce through `GlobalNormalisers.reducer`, so they normalise the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def _check(values_BT: torch.Tensor, mask_BT: torch.Tensor, normaliser: float, name: str) -> None:
    if values_BT.shape != mask_BT.shape:
        raise ValueError(f"values shape {tuple(values_BT.shape)} != mask shape {tuple(mask_BT.shape)}")
    if values_BT.dim() != 2:
        raise ValueError(f"expected [B, T] tensors, got shape {tuple(values_BT.shape)}")
    if not normaliser > 0:
        raise ValueError(f"{name} must be > 0 (the global batch's count), got {normaliser}")


def sum_of_sample_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor, *, num_global_samples: float) -> torch.Tensor:
    """Sum over local samples of each sample's masked token mean, over ``num_global_samples``."""
    _check(values_BT, mask_BT, num_global_samples, "num_global_samples")
    mask_BT = mask_BT.to(values_BT.dtype)
    tokens_B = mask_BT.sum(dim=-1).clamp(min=1)
    sample_mean_B = (values_BT * mask_BT).sum(dim=-1) / tokens_B
    return sample_mean_B.sum() / num_global_samples


def per_token_sum(values_BT: torch.Tensor, mask_BT: torch.Tensor, *, num_global_tokens: float) -> torch.Tensor:
    """Masked token sum over ``num_global_tokens`` (``--calculate-per-token-loss``)."""
    _check(values_BT, mask_BT, num_global_tokens, "num_global_tokens")
    return (values_BT * mask_BT.to(values_BT.dtype)).sum() / num_global_tokens


REDUCERS: dict[str, Callable[..., torch.Tensor]] = {
    "sum_of_sample_mean": sum_of_sample_mean,
    "per_token_sum": per_token_sum,
}


def make_reducer(
    mask_BT: torch.Tensor,
    *,
    per_token_loss: bool,
    num_global_samples: float | None = None,
    num_global_tokens: float | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Bind a mask and the global normaliser: returns ``values_BT -> scalar``.

    ``per_token_loss`` (``--calculate-per-token-loss``) selects :func:`per_token_sum`, which needs
    ``num_global_tokens``; otherwise :func:`sum_of_sample_mean`, which needs ``num_global_samples``.
    """
    if per_token_loss:
        if num_global_tokens is None:
            raise ValueError("per-token loss (--calculate-per-token-loss) needs num_global_tokens")
        return lambda values_BT: per_token_sum(values_BT, mask_BT, num_global_tokens=num_global_tokens)
    if num_global_samples is None:
        raise ValueError("per-sample-mean loss needs num_global_samples (samples in the global batch)")
    return lambda values_BT: sum_of_sample_mean(values_BT, mask_BT, num_global_samples=num_global_samples)


@dataclass(kw_only=True)
class GlobalNormalisers:
    """The counts of the GLOBAL batch of this optimizer step (all micro-batches on all data-parallel
    ranks) that a loss's inputs carry: ``num_global_samples`` (samples, for the per-sample mean) and
    ``num_global_tokens`` (loss tokens, for ``--calculate-per-token-loss``). Keyword-only fields, so
    a loss-inputs dataclass that adds its tensors keeps them positional."""

    num_global_samples: float | None = None
    num_global_tokens: float | None = None

    def reducer(self, mask_BT: torch.Tensor, *, per_token_loss: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        """:func:`make_reducer` bound to ``mask_BT`` and these counts."""
        return make_reducer(mask_BT, per_token_loss=per_token_loss, num_global_samples=self.num_global_samples,
                            num_global_tokens=self.num_global_tokens)


def count_global_normalisers(mask_BT: torch.Tensor) -> tuple[int, int]:
    """Local ``(num_samples, num_tokens)`` of a batch; sum them over micro-batches and ranks
    (e.g. one all-reduce) to get the global normalisers the reducers need."""
    return int(mask_BT.shape[0]), int(mask_BT.sum().item())
