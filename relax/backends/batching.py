"""Turning a list of variable-length samples into padded micro-batches and back.

A sample here is `tokens` (prompt + response ids) plus `response_length`; everything the loss
needs is response-aligned: row i of a `[B, T]` tensor holds sample i's response tokens,
right-padded to T = the longest response in the micro-batch.
"""

from __future__ import annotations

from typing import Sequence

import torch


def split_micro_batches(lengths: Sequence[int], *, micro_batch_size: int,
                        max_tokens: int | None = None) -> list[list[int]]:
    """Index lists of the micro-batches, in order.

    Fixed size by default; with `max_tokens` (dynamic batching) consecutive samples are packed
    while the padded micro-batch, rows x its longest row, stays within the budget (a longer
    sample goes alone). The padded count is what a right-padded `[B, L]` forward holds in
    memory: counting only real tokens let long-tailed lengths pack ~100 short rows beside one
    long one, a micro-batch several times the budget (an out-of-memory error on GPUs).
    """
    if max_tokens is None:
        n = len(lengths)
        return [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def even_out(micro: list[list[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    """`micro` made `count` micro-batches long, for ranks that must run as many forwards (an
    FSDP forward all-gathers the weights, an expert-parallel one exchanges tokens): the
    micro-batch with the largest padded size (rows x longest row) is halved, order kept, until
    there are `count`; a rank with fewer rows than `count` gets empty ones at the end (the
    caller runs a throwaway forward for each)."""
    micro = [list(m) for m in micro]
    while len(micro) < count:
        splittable = [i for i, m in enumerate(micro) if len(m) > 1]
        if not splittable:
            return micro + [[] for _ in range(count - len(micro))]
        i = max(splittable, key=lambda j: len(micro[j]) * max(lengths[r] for r in micro[j]))
        half = len(micro[i]) // 2
        micro[i:i + 1] = [micro[i][:half], micro[i][half:]]
    return micro


def pad_inputs(tokens: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids_BL` and `attention_mask_BL`."""
    width = max(len(t) for t in tokens)
    ids_BL = torch.full((len(tokens), width), pad_id, dtype=torch.long)
    mask_BL = torch.zeros((len(tokens), width), dtype=torch.long)
    for i, t in enumerate(tokens):
        ids_BL[i, : len(t)] = torch.as_tensor(t, dtype=torch.long)
        mask_BL[i, : len(t)] = 1
    return ids_BL, mask_BL


def response_positions(total_lengths: Sequence[int],
                       response_lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each response token's log-prob sits in the shifted `[B, L-1]` token log-probs.

    Position p of the shifted sequence predicts token p+1, so sample i's response (its last
    R_i of n_i tokens) is read at positions n_i - R_i - 1 ... n_i - 2. Returns `index_BT`
    (clamped to valid positions) and `mask_BT` (1 on real response tokens).
    """
    width = max(max(response_lengths), 1)
    offsets_T = torch.arange(width)
    starts_B = torch.as_tensor([n - r - 1 for n, r in zip(total_lengths, response_lengths)])
    index_BT = starts_B[:, None] + offsets_T[None, :]
    mask_BT = offsets_T[None, :] < torch.as_tensor(response_lengths)[:, None]
    return index_BT.clamp(min=0), mask_BT


def pad_response(values: Sequence[Sequence[float]] | Sequence[torch.Tensor], width: int,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad per-sample response-aligned values to `[B, width]` with zeros."""
    out_BT = torch.zeros((len(values), width), dtype=dtype)
    for i, v in enumerate(values):
        v = torch.as_tensor(v, dtype=dtype)[:width]
        out_BT[i, : len(v)] = v
    return out_BT
