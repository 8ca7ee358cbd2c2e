"""Response-token log-probs and entropies from a vocabulary-parallel output layer.

Under tensor parallelism each rank holds rows [start, start + V/tp) of the output weight, so
each computes a slice of every token's logits. `vocab_parallel_log_probs` combines the slices
with three all-reduces over the tensor-parallel group (max, sum of exps, the target's logit).
Every rank of the group then computes the same loss from the reduced values, so a reduction's
backward is the identity on each rank (megatron's `reduce_from_tensor_model_parallel_region`;
an all-reduce in backward too would multiply the gradient by the group size):
    lse_N   = m_N + log sum_tp sum_v exp(z_Nv - m_N)
    logp_N  = z_N[target] - lse_N
    H_N     = lse_N - sum_tp sum_v softmax_Nv * z_Nv
Megatron pads the vocabulary (`--make-vocab-size-divisible-by` x TP, `convert.Layout.padded`): the
padded rows' logits are masked to a value whose exp() is exactly 0 (one rank: the rows are cut
off), so log-probs, entropies and gradients are those of the real vocabulary alone.
One rank (tp = 1) takes the chunked head the fsdp backend uses (no [N, V] logits at once; its
compiled per-chunk kernels, `fused`, under --use-torch-compile on a GPU, as fsdp).

`MegatronResponseHead` swaps the `GPTModel`'s output layer for one forward, as the fsdp
backend's `ResponseHead` does for an HF model: the model returns `[B, T, 2]` (log-prob, entropy)
of the response tokens instead of `[B, L, V]` logits. Each response token's hidden state is read at
`flat_BT`, its place in the batch-major flattened hidden states (`[B * L]` padded rows, or the `[N]`
packed stream of --qkv-format thd). With --recompute-loss-function the vocabulary-parallel
computation (TP > 1) runs under activation checkpointing: only the hidden states and the weight are
kept for backward, which recomputes the `[N, V/tp]` logits (and their all-reduces, in the same order
on every rank of the group); the chunked one-rank head recomputes its chunks' logits always.

Under context parallelism a rank holds the hidden states of its chunks only (`attention.py`):
it computes the response tokens read at those positions, zero elsewhere, and the `[B, T, 2]`
values are summed over the context-parallel group, so every rank of the group holds every
token's values and computes the same loss as one rank would. As for the vocabulary reductions,
the sum's backward is the identity: each rank back-propagates the gradient of its own tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from relax.algorithms.chunked_logprobs import chunked_token_log_probs


PADDED_LOGIT = -1e30  # a padded vocabulary row's logit: exp() of it is exactly 0, 0 * it is 0 (no NaN)


def vocab_parallel_log_probs(logits_NV: torch.Tensor, targets_N: torch.Tensor, vocab_start: int, group: Any, *,
                             entropy: bool, vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each target, entropy or None) from this rank's vocabulary slice of the logits.
    Columns at or past `vocab_size` (megatron's padded vocabulary rows) count as probability 0."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    def all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
        return reduce_from_tensor_model_parallel_region(x, group=group)

    logits_NV = logits_NV.float()
    if vocab_size is not None and vocab_start + logits_NV.shape[-1] > vocab_size:
        padded_V = torch.arange(vocab_start, vocab_start + logits_NV.shape[-1], device=logits_NV.device) >= vocab_size
        logits_NV = logits_NV.masked_fill(padded_V, PADDED_LOGIT)
    m_N = logits_NV.detach().max(dim=-1).values
    dist.all_reduce(m_N, op=dist.ReduceOp.MAX, group=group)  # a constant shift: no gradient needed
    shifted_NV = logits_NV - m_N[:, None]
    sum_exp_N = all_reduce(shifted_NV.exp().sum(-1), group=group)
    lse_N = m_N + sum_exp_N.log()
    local_N = targets_N - vocab_start
    inside_N = (local_N >= 0) & (local_N < logits_NV.shape[-1])
    picked_N = logits_NV.gather(1, local_N.clamp(0, logits_NV.shape[-1] - 1)[:, None])[:, 0] * inside_N
    logp_N = all_reduce(picked_N, group=group) - lse_N
    if not entropy:
        return logp_N, None
    p_NV = (logits_NV - lse_N[:, None]).exp()
    ent_N = lse_N - all_reduce((p_NV * logits_NV).sum(-1), group=group)
    return logp_N, ent_N


class MegatronResponseHead:
    """Context manager: for one forward, the model's `output_layer` returns `[T, B, 2]` =
    (log-prob, entropy) of the response tokens (`GPTModel` transposes it to `[B, T, 2]`).
    Row b's token t is read at flattened hidden position `flat_BT[b, t]` and predicts
    `targets_BT[b, t]`; with `cp_group`, positions are this rank's local ones and `mask_BT` marks the
    tokens it holds. `recompute`: --recompute-loss-function (TP > 1)."""

    def __init__(self, layer: torch.nn.Module, flat_BT: torch.Tensor, mask_BT: torch.Tensor,
                 targets_BT: torch.Tensor, *, temperature: float, chunk: int | None, entropy: bool,
                 entropy_grad: bool, tp_group: Any, tp_rank: int, tp_size: int, sequence_parallel: bool,
                 cp_group: Any = None, fused: bool = False, vocab_size: int | None = None, recompute: bool = False):
        self.layer, self.flat_BT, self.mask_BT, self.targets_BT = layer, flat_BT, mask_BT.bool(), targets_BT
        self.recompute = recompute
        self.vocab_size = vocab_size  # the real vocabulary: rows past it are padding (never sampled or trained)
        self.temperature, self.chunk, self.entropy, self.entropy_grad = temperature, chunk, entropy, entropy_grad
        self.tp_group, self.tp_rank, self.tp_size = tp_group, tp_rank, tp_size
        self.sequence_parallel, self.cp_group, self.fused = sequence_parallel, cp_group, fused

    def forward(self, hidden_LBH: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: Any = None):
        if self.sequence_parallel:  # the backward reduce-scatters: each rank's hidden gradient is partial
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_LBH = gather_from_sequence_parallel_region(hidden_LBH, tensor_parallel_output_grad=True,
                                                              group=self.tp_group)
        weight = self.layer.weight if weight is None else weight
        length, b, h = hidden_LBH.shape
        hidden_NH = hidden_LBH.transpose(0, 1).reshape(b * length, h)[self.flat_BT[self.mask_BT]]
        targets_N = self.targets_BT[self.mask_BT]
        if self.tp_size == 1:
            logp_N, ent_N = chunked_token_log_probs(hidden_NH, weight[:self.vocab_size], targets_N,
                                                    temperature=self.temperature, chunk=self.chunk,
                                                    entropy=self.entropy, fused=self.fused)
        else:
            logp_N, ent_N = self.vocab_parallel(hidden_NH, weight, targets_N)

        def scatter(values_N: torch.Tensor) -> torch.Tensor:
            return values_N.new_zeros(self.mask_BT.shape).index_put((self.mask_BT,), values_N)

        ent_BT = scatter(ent_N if self.entropy_grad else ent_N.detach()) if ent_N is not None \
            else torch.zeros_like(self.mask_BT, dtype=torch.float32)
        out_BT2 = torch.stack([scatter(logp_N), ent_BT], dim=-1)
        if self.cp_group is not None:  # each token from the rank that holds it
            from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

            out_BT2 = reduce_from_tensor_model_parallel_region(out_BT2, group=self.cp_group)
        return out_BT2.transpose(0, 1), None

    def vocab_parallel(self, hidden_NH: torch.Tensor, weight: torch.Tensor,
                       targets_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs, entropies) from this rank's vocabulary slice of the output layer (TP > 1)."""
        from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

        # As the column-parallel output layer does: each rank's logits slice gives a partial
        # gradient of the hidden states, summed over the group in backward.
        if not self.sequence_parallel:  # (with it, the gather in `forward` sums them)
            hidden_NH = copy_to_tensor_model_parallel_region(hidden_NH, group=self.tp_group)

        def head(hidden_NH: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            logits_NV = (hidden_NH @ weight.t()).float() / self.temperature
            return vocab_parallel_log_probs(logits_NV, targets_N, self.tp_rank * weight.shape[0], self.tp_group,
                                            entropy=self.entropy, vocab_size=self.vocab_size)

        if self.recompute and torch.is_grad_enabled():  # --recompute-loss-function: no logits kept for backward
            return checkpoint(head, hidden_NH, weight, use_reentrant=False)
        return head(hidden_NH, weight)

    def __enter__(self) -> "MegatronResponseHead":
        self.layer.forward = self.forward  # the instance attribute shadows the class's forward
        return self

    def __exit__(self, *exc: object) -> None:
        del self.layer.forward


class MegatronValueHead:
    """Context manager: for one forward, the `GPTModel`'s `output_layer` returns `[T, B, 1]`, the
    values of the response tokens from the critic's scalar head `value_head` (hidden -> 1, the
    fsdp critic's `score`), read at the same positions (`flat_BT`) as `MegatronResponseHead`'s log-probs.
    The head is replicated over the tensor group: every rank computes the same values and loss, so
    under --sequence-parallel the gathered hidden states' gradient is split back, not summed."""

    def __init__(self, layer: torch.nn.Module, value_head: torch.nn.Module, flat_BT: torch.Tensor,
                 mask_BT: torch.Tensor, *, tp_group: Any, sequence_parallel: bool, cp_group: Any = None):
        self.layer, self.value_head, self.flat_BT, self.mask_BT = layer, value_head, flat_BT, mask_BT.bool()
        self.tp_group, self.sequence_parallel, self.cp_group = tp_group, sequence_parallel, cp_group

    def forward(self, hidden_LBH: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: Any = None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_LBH = gather_from_sequence_parallel_region(hidden_LBH, tensor_parallel_output_grad=False,
                                                              group=self.tp_group)
        length, b, h = hidden_LBH.shape
        hidden_NH = hidden_LBH.transpose(0, 1).reshape(b * length, h)[self.flat_BT[self.mask_BT]]
        values_N = self.value_head(hidden_NH.to(self.value_head.weight.dtype))[:, 0].float()
        values_BT = values_N.new_zeros(self.mask_BT.shape).index_put((self.mask_BT,), values_N)
        if self.cp_group is not None:  # each token from the context-parallel rank that holds it
            from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

            values_BT = reduce_from_tensor_model_parallel_region(values_BT, group=self.cp_group)
        return values_BT.transpose(0, 1)[..., None], None

    def __enter__(self) -> "MegatronValueHead":
        self.layer.forward = self.forward
        return self

    def __exit__(self, *exc: object) -> None:
        del self.layer.forward
