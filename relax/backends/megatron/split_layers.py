"""--tp-comm-split: a packed micro-batch's decoder layers run as two halves, interleaved layer by layer.

At tensor parallelism without Transformer Engine, every decoder layer's forward ends its attention
and its MLP with an all-reduce of the row-parallel linear's output (its backward with one of the
column-parallel linear's input gradient), and the next matmul needs that sum: on a GPU the
collectives sit on the critical path between the matmuls (docs/gpu.md: ~13-19% of a 4B-shaped
TP=2 step on 2x H200). Split the micro-batch's rows into two halves of about equal token count
and run them through the layers in turn, each half on a CUDA stream of its own: while one half's
all-reduce runs, the other half's matmuls do (the idea of Domino, arXiv 2409.15241). The NCCL
collectives of both halves go through the tensor group's one communicator in the order they are
issued (half A's layer i, half B's layer i, half A's layer i + 1, ...), the same on every rank;
autograd runs each half's backward on the stream its forward ran on, so the backward interleaves
the same way.

Rows never mix: a decoder layer is per token except attention, which attends within each row
(`packing.packed_attention`), so each half is a packed stream of whole rows of its own
(`PackedRows` over its rows) and the outputs are the unsplit forward's up to the order of
floating-point sums in the matmuls. Used only where that holds: --qkv-format thd rows
(`rank.packed`) without --sequence-parallel (its hidden states are a shard of the stream, not whole
rows) and without full recomputation (megatron-core's checkpointed forward); elsewhere the block's
own forward runs. On a CPU there are no streams and the halves run one after the other: the
same numbers, which the CPU tests compare with the unsplit forward.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from relax.backends.megatron.packing import PackedRows, pack


def halves(seqlens: list[int]) -> int | None:
    """Where to cut packed rows of `seqlens` into two halves of about equal token count: the number
    of rows in the first half, or None for a single row."""
    if len(seqlens) < 2:
        return None
    total, acc, best = sum(seqlens), 0, None
    for k in range(1, len(seqlens)):
        acc += seqlens[k - 1]
        if best is None or abs(2 * acc - total) < abs(2 * best[1] - total):
            best = (k, acc)
    return best[0]


def split_rows(seqlens: list[int], device: torch.device) -> tuple[tuple[int, PackedRows], ...] | None:
    """Each half's token count and `PackedRows` (whole rows, no padding segment of their own)."""
    cut = halves(seqlens)
    if cut is None:
        return None
    first, second = seqlens[:cut], seqlens[cut:]
    return (sum(first), pack(first, sum(first), device)), (sum(second), pack(second, sum(second), device))


def install(block: torch.nn.Module) -> None:
    """Make `block` (megatron-core's TransformerBlock) run packed micro-batches that carry halves
    (`PackedRows.halves`) split; any other call goes to its own forward."""
    own_forward = block.forward

    def forward(hidden_states: torch.Tensor, attention_mask: Any = None, **kwargs: Any) -> torch.Tensor:
        parts = getattr(attention_mask, "halves", None)
        if parts is None or not _plain(block, kwargs):
            return own_forward(hidden_states=hidden_states, attention_mask=attention_mask, **kwargs)
        return run_split(block, hidden_states, parts, kwargs.get("rotary_pos_emb"))

    block.forward = forward


def _plain(block: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    """A call this split runs as the block would: no context, cache, cos/sin RoPE or recomputation."""
    used = {k for k, v in kwargs.items() if v is not None and k != "rotary_pos_emb"}
    recompute = block.config.recompute_granularity == "full" and block.training
    return not used and not recompute and not block.config.sequence_parallel


def run_split(block: torch.nn.Module, hidden_N1H: torch.Tensor, parts: tuple[tuple[int, PackedRows], ...],
              rope_N11D: torch.Tensor | None) -> torch.Tensor:
    """The block's layers over each half in turn, layer by layer (each half on its own CUDA stream
    on a GPU), then its final norm over the halves joined again."""
    cuda = hidden_N1H.is_cuda
    main = torch.cuda.current_stream() if cuda else None
    streams = _streams(block, len(parts)) if cuda else [None] * len(parts)
    hidden, ropes, start = [], [], 0
    for (n, _), stream in zip(parts, streams):
        h, rope = hidden_N1H[start:start + n], None if rope_N11D is None else rope_N11D[start:start + n]
        if stream is not None:
            stream.wait_stream(main)
            for t in (h, rope):
                if t is not None:
                    t.record_stream(stream)  # the main stream's memory, read on this one
        hidden.append(h)
        ropes.append(rope)
        start += n
    for layer in block.layers:
        for i, ((_, rows), stream) in enumerate(zip(parts, streams)):
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                hidden[i], _ = layer(hidden_states=hidden[i], attention_mask=rows, rotary_pos_emb=ropes[i])
    if cuda:
        for stream, h in zip(streams, hidden):
            main.wait_stream(stream)
            h.record_stream(main)  # each half's memory, read by the join on the main stream
    out = torch.cat(hidden, 0)
    if block.final_layernorm is not None:
        out = block.final_layernorm(out)
    return out


def _streams(block: torch.nn.Module, count: int) -> list[torch.cuda.Stream]:
    streams = getattr(block, "_split_streams", None)
    if streams is None or len(streams) != count:
        streams = [torch.cuda.Stream() for _ in range(count)]
        block._split_streams = streams
    return streams
