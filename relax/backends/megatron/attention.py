"""The two modules this backend puts into megatron-core's local layer spec in place of its own.

`SDPACoreAttention`: causal self-attention through `torch.nn.functional.scaled_dot_product_attention`.

megatron-core's own local `DotProductAttention` builds the full [batch x heads, seq, seq] score
matrix in the parameter dtype and keeps it for backward (at 16 x 1024 tokens of a Qwen3-0.6B that
is GiBs per layer); without Transformer Engine there is no fused kernel to pick instead. This
module takes the same place in the layer spec (`core_attention`) with the same call, and lets
PyTorch choose the kernel (flash / memory-efficient on GPUs, the math kernel on CPU), with GQA
heads shared by the kernel (`enable_gqa`) instead of repeated. Rows are right-padded and the mask
is causal, so the kernel's own causal masking gives every real token exactly the keys it may see
(each row is one sequence: the batch dimension is the sequence boundary). Packed rows (--qkv-format
thd, `packing.py`) arrive as one `[N, 1, heads, d]` row with their `PackedRows` in the mask slot:
attention within each row (`packing.packed_attention`).

Context parallelism (`--context-parallel-size` C > 1; megatron-core's own CP attention is
Transformer Engine's): each rank holds 2 of the 2C chunks of every row (`cp_positions`), so its
queries see only part of the keys. K and V are all-gathered over the context-parallel group
(megatron's `gather_from_sequence_parallel_region`: the backward reduce-scatters their gradients,
each rank getting the sum of every rank's gradient for its own keys), and the causal mask compares
global positions: `attention_mask` is then the worker's `[1, 1, S, C*S]` (True = masked) from
`cp_causal_mask`, its keys in the all-gathered order (rank 0's chunks, rank 1's, ...). With
--allgather-cp each rank holds one contiguous chunk of every row instead (`contiguous`): the same
gathered keys and global-position mask, RoPE cut to those positions (`install_cp_rope`).

`RMSNorm`: megatron-core's torch norm (`WrappedTorchNorm`, used without Transformer Engine or
Apex) refuses sequence parallelism. An RMSNorm is per token, so it runs on a sequence shard as it
does on the whole sequence; only its weight's gradient is then partial, summed over the tensor
group by the worker (the weight is marked `sequence_parallel`, as megatron's own norms mark it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

from relax.backends.megatron.packing import PackedRows, packed_attention


class SDPACoreAttention(MegatronModule):
    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None, **kwargs: Any) -> None:
        super().__init__(config=config)
        tp = config.tensor_model_parallel_size
        self.heads = config.num_attention_heads // tp
        self.groups = (config.num_query_groups or config.num_attention_heads) // tp
        self.softmax_scale = softmax_scale
        pg = kwargs.get("pg_collection")
        self.cp_group = pg.cp if pg is not None and config.context_parallel_size > 1 else None
        if attention_type != "self":
            raise ValueError(f"SDPACoreAttention is for causal self-attention, not {attention_type}")

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None,
                **_: Any) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SDPACoreAttention takes neither an attention bias nor megatron-core's packed sequences")
        if isinstance(attention_mask, PackedRows):  # --qkv-format thd: one [N, 1, heads, d] row of rows
            out = packed_attention(query[:, 0], key[:, 0], value[:, 0], attention_mask, scale=self.softmax_scale,
                                   gqa=self.heads != self.groups)
            return out[:, None]  # [N, 1, heads * d]
        mask = None
        if self.cp_group is not None:  # keys and values of the whole row, queries of this rank's chunks
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            key, value = (gather_from_sequence_parallel_region(t, tensor_parallel_output_grad=True, group=self.cp_group)
                          for t in (key, value))  # [C*s, b, groups, d]
            mask = ~attention_mask  # [1, 1, s, C*s], True = may attend
        # [s, b, heads, d] -> [b, heads, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.softmax_scale,
                                             enable_gqa=self.heads != self.groups)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)  # [s, b, heads * d]


def cp_positions(length: int, cp_size: int, cp_rank: int, contiguous: bool = False) -> torch.Tensor:
    """The global positions rank `cp_rank` holds of a row of `length` (a multiple of 2C) under
    megatron's load-balanced split: of 2C equal chunks, chunks r and 2C-1-r (each rank then has
    as many early, cheap queries as late, expensive ones). `contiguous` (--allgather-cp): chunk r of
    C (`length` a multiple of C)."""
    if contiguous:
        chunk = length // cp_size
        return torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    chunk = length // (2 * cp_size)
    first, second = cp_rank * chunk, (2 * cp_size - 1 - cp_rank) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)])  # [2 * chunk]


def cp_causal_mask(length: int, cp_size: int, cp_rank: int, contiguous: bool = False) -> torch.Tensor:
    """`[1, 1, S, C*S]`, True = masked: this rank's queries (S = length / C) against the keys of
    every rank in all-gathered order; a key is visible when its global position is not later."""
    keys_K = torch.cat([cp_positions(length, cp_size, r, contiguous) for r in range(cp_size)])
    queries_S = cp_positions(length, cp_size, cp_rank, contiguous)
    return (keys_K[None, :] > queries_S[:, None])[None, None]


def install_cp_rope(rope: torch.nn.Module, cp_size: int, cp_rank: int) -> None:
    """--allgather-cp: the model's RoPE table cut to this rank's contiguous chunk of positions
    (megatron-core cuts it to the load-balanced chunks r and 2C-1-r)."""
    def forward(max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group: Any = None) -> torch.Tensor:
        emb = rope.get_emb(max_seq_len, offset)  # [L, 1, 1, D], L the whole row
        return emb[cp_positions(max_seq_len, cp_size, cp_rank, contiguous=True).to(emb.device)]

    rope.forward = forward


class RMSNorm(torch.nn.Module):
    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
