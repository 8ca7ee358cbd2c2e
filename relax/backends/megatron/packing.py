"""--qkv-format thd: a micro-batch's rows packed into one token stream.

A bshd micro-batch is `[B, L]` right-padded rows: every layer runs on B x L tokens, most of them
pads when lengths are long-tailed. Packed, the rows are concatenated into one `[1, N]` stream (N =
their total length) that megatron-core runs as a batch of one row: the embedding, linear layers,
norms, MoE and the response head see the N real tokens (`[N, 1, H]` hidden states). Two things make
it the rows' computation and not one long sequence's:
- RoPE: for the forward, the model's rotary embedding returns each token's frequencies at its
  position within its own row (`PackedRoPE`; positions restart at 0 in each row), which
  megatron-core applies per token as it does for any row;
- attention: the core attention (`attention.SDPACoreAttention`) gets the rows' `PackedRows` in
  the attention-mask slot, scatters each row's q, k, v into a `[segments, longest, heads, d]`
  grid and runs the same causal SDPA as a padded micro-batch (`packed_attention`): only that grid
  is padded (PyTorch has no variable-length SDPA kernel on CPU), and the numbers are bshd's.
megatron-core's own thd path (`PackedSeqParams`) is not used: without Transformer Engine its RoPE
splits the stream per row on the host in every layer (a device sync, and graph breaks in the
compiled layers of --use-torch-compile); here the per-token frequencies and the grid's slots are
computed once per micro-batch.

N is padded by one extra segment of pad tokens (attending only to each other) to the same count on
every rank of the expert group, whose forwards exchange equal-sized token blocks, and to a multiple of
the tensor-parallel size under --sequence-parallel (`micro_batch.common_tokens`). The response head
reads each response token at its packed position (`micro_batch._packed`). Not packed (`rank.packed`):
pipeline stages (one activation shape per schedule), context parallelism (rows split into chunks),
routing replay (routes laid out per padded row) and VL models (M-RoPE positions per padded row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PackedRows:
    """Where the rows of a packed stream are: each token's slot in the `[segments * longest]`
    attention grid and its position within its row; `starts_S` the first token of each segment."""

    slots_N: torch.Tensor
    positions_N: torch.Tensor
    starts_S: torch.Tensor
    segments: int
    longest: int


def pack(lengths: list[int], total: int, device: torch.device) -> PackedRows:
    """Rows of `lengths` packed in order, padded to `total` tokens by one more segment (none when
    they fill it)."""
    seqlens = list(lengths) + ([total - sum(lengths)] if total > sum(lengths) else [])
    longest = max(seqlens)
    positions_N = torch.cat([torch.arange(n) for n in seqlens])
    slots_N = torch.cat([torch.arange(n) + i * longest for i, n in enumerate(seqlens)])
    starts_S = torch.tensor([0, *seqlens[:-1]]).cumsum(0)
    return PackedRows(slots_N.to(device), positions_N.to(device), starts_S.to(device), len(seqlens), longest)


def packed_attention(query_NHD: torch.Tensor, key_NGD: torch.Tensor, value_NGD: torch.Tensor, rows: PackedRows,
                     *, scale: float | None, gqa: bool) -> torch.Tensor:
    """Causal self-attention within each segment: q `[N, heads, d]`, k and v `[N, groups, d]` ->
    `[N, heads * d]`, through one SDPA call over the segments laid out as padded rows."""
    s, longest = rows.segments, rows.longest

    def grid(t_NXD: torch.Tensor) -> torch.Tensor:  # -> [s, X, longest, d]
        t = t_NXD.new_zeros(s * longest, *t_NXD.shape[1:]).index_copy(0, rows.slots_N, t_NXD)
        return t.view(s, longest, *t_NXD.shape[1:]).transpose(1, 2)

    out_SHLD = F.scaled_dot_product_attention(grid(query_NHD), grid(key_NGD), grid(value_NGD), is_causal=True,
                                              scale=scale, enable_gqa=gqa)
    return out_SHLD.transpose(1, 2).reshape(s * longest, -1).index_select(0, rows.slots_N)


class PackedRoPE:
    """Context manager: for one forward, megatron-core's rotary embedding `rope` returns
    `[N, 1, 1, D]`, each packed token's frequencies at its position within its row."""

    def __init__(self, rope: Any, rows: PackedRows) -> None:
        self.rope, self.rows = rope, rows

    def __enter__(self) -> "PackedRoPE":
        freqs_N11D = self.rope.get_emb(self.rows.longest)[self.rows.positions_N]
        self.rope.forward = lambda *args, **kwargs: freqs_N11D  # the instance attribute shadows the class's
        return self

    def __exit__(self, *exc: object) -> None:
        del self.rope.forward
