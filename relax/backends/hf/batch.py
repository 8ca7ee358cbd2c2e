"""The running batch of the `hf` decoder and its KV cache bookkeeping.

Two layouts (decoder.py's module doc): `DynamicBatch`, rows over one transformers `DynamicCache`,
each row left-padded (`left_pad`: mask 0 on padding, position ids counted from the row's first
real token); a group that joins is merged in (`merge_caches`: the shorter cache left-padded with
zero keys/values, mask 0, then the two stacked along the batch), and columns that are padding for
every remaining row are dropped when rows finish (`trim_left_padding`), so the cache never grows
past the longest live row. `SlotBatch`: rows on the slot cache of `static_cache.py`, each in its
own slot, nothing merged or trimmed; a finished row's slot is freed. Joining a `DynamicCache`
needs plain `DynamicLayer` layers (`cache_supports_join`). Rows with the same prompt share one
prefill (`shared_prefill`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from relax.backends.hf.sampling import SamplingBatch
from relax.backends.hf.static_cache import SlotCache

def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts. Returns (input_ids_BL, attention_mask_BL, position_ids_BL)."""
    length = max(len(p) for p in prompts)
    input_ids_BL = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask_BL = torch.zeros((len(prompts), length), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        input_ids_BL[b, length - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        mask_BL[b, length - len(prompt):] = 1
    position_ids_BL = (mask_BL.cumsum(-1) - 1).clamp(min=0)
    return input_ids_BL.to(device), mask_BL.to(device), position_ids_BL.to(device)


def merge_caches(cache_a: DynamicCache, mask_a_BT: torch.Tensor, cache_b: DynamicCache,
                 mask_b_BT: torch.Tensor) -> tuple[DynamicCache, torch.Tensor]:
    """Concatenate two left-padded KV caches along the batch: rows of `a` first, then rows of `b`.

    The shorter cache is left-padded along the sequence dimension (zero keys/values, mask 0)
    to the longer one's length T. Each layer stores `keys`/`values` of shape (B, H, T, D);
    masks are (B, T) over the cached columns. `cache_a` is updated in place and returned with
    the merged (B_a + B_b, T) mask.
    """
    if len(cache_a.layers) != len(cache_b.layers):
        raise ValueError(f"cannot merge KV caches with {len(cache_a.layers)} and {len(cache_b.layers)} layers")
    length = max(mask_a_BT.shape[1], mask_b_BT.shape[1])
    for layer_a, layer_b in zip(cache_a.layers, cache_b.layers):
        if type(layer_a) is not DynamicLayer or type(layer_b) is not DynamicLayer:
            raise ValueError(f"merge_caches needs plain DynamicLayer layers, got {type(layer_a).__name__} "
                             f"and {type(layer_b).__name__}")
        for layer, mask_BT in ((layer_a, mask_a_BT), (layer_b, mask_b_BT)):
            if layer.keys.shape[-2] != mask_BT.shape[1]:
                raise ValueError(f"KV cache holds {layer.keys.shape[-2]} positions but its mask has "
                                 f"{mask_BT.shape[1]} columns")
        layer_a.keys = torch.cat([_pad_left(layer_a.keys, length, -2), _pad_left(layer_b.keys, length, -2)], 0)
        layer_a.values = torch.cat([_pad_left(layer_a.values, length, -2),
                                    _pad_left(layer_b.values, length, -2)], 0)
    mask_BT = torch.cat([_pad_left(mask_a_BT, length, 1), _pad_left(mask_b_BT, length, 1)], 0)
    return cache_a, mask_BT


def trim_left_padding(cache: DynamicCache, mask_BT: torch.Tensor) -> torch.Tensor:
    """Drop leading cache columns that are padding (mask 0) in every row; returns the trimmed mask."""
    real_T = mask_BT.any(dim=0)
    if mask_BT.shape[1] == 0 or bool(real_T[0]) or not bool(real_T.any()):
        return mask_BT
    start = int(real_T.nonzero()[0])
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, start:]
        layer.values = layer.values[:, :, start:]
    return mask_BT[:, start:]


def _pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Zero-pad `tensor` at the start of dimension `dim` up to `length`."""
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def shared_prefill(prompts: Sequence[Sequence[int]]) -> tuple[list[Sequence[int]], list[int]]:
    """The distinct prompts in first-seen order, and for each row the index of its prompt there."""
    position: dict[tuple[int, ...], int] = {}
    index = [position.setdefault(tuple(p), len(position)) for p in prompts]
    firsts: list[Sequence[int]] = [None] * len(position)  # type: ignore[list-item]
    for p, i in zip(prompts, index):
        if firsts[i] is None:
            firsts[i] = p
    return firsts, index


def cache_supports_join(config: Any) -> bool:
    """True when the model's DynamicCache is made only of plain full-attention layers (mergeable)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


@dataclass
class DynamicBatch:
    """The running rows: the KV cache of their past and the token each feeds next (not yet cached).

    `rows` indexes the decoder's row states; `mask_BT` covers the T cached columns; `next_ids_B`
    and `next_pos_B` are each row's next input token and its position id.
    """

    rows: list[int]
    cache: DynamicCache
    mask_BT: torch.Tensor
    next_ids_B: torch.Tensor
    next_pos_B: torch.Tensor
    sampling: SamplingBatch

    def select(self, keep: list[int]) -> "DynamicBatch | None":
        """Keep only the rows at batch positions `keep` (None when empty); trims shared padding."""
        if not keep:
            return None
        if len(keep) == len(self.rows):
            return self
        index = torch.tensor(keep, dtype=torch.long, device=self.mask_BT.device)
        self.cache.batch_select_indices(index)
        mask_BT = trim_left_padding(self.cache, self.mask_BT[index])
        return DynamicBatch([self.rows[b] for b in keep], self.cache, mask_BT, self.next_ids_B[index],
                            self.next_pos_B[index], self.sampling.select(keep))

    def join(self, group: "DynamicBatch") -> "DynamicBatch":
        """Append a freshly prefilled group's rows to this batch (caches merged)."""
        cache, mask_BT = merge_caches(self.cache, self.mask_BT, group.cache, group.mask_BT)
        return DynamicBatch(self.rows + group.rows, cache, mask_BT, torch.cat([self.next_ids_B, group.next_ids_B]),
                            torch.cat([self.next_pos_B, group.next_pos_B]), self.sampling.concat(group.sampling))


@dataclass
class SlotBatch:
    """The running rows on the slot cache (`static_cache.py`): each row's slot, the column its
    next token is written to (`write_B`, host copy `writes`), its first cached column (`start_B`),
    its position offset (`offset_B`: a VL row's, static_cache's module doc; zeros otherwise)."""

    rows: list[int]
    slots: list[int]
    writes: list[int]
    next_ids_B: torch.Tensor
    write_B: torch.Tensor
    start_B: torch.Tensor
    sampling: SamplingBatch
    cache: SlotCache
    slots_B: torch.Tensor = None  # type: ignore[assignment]
    offset_B: torch.Tensor = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.slots_B is None:
            self.slots_B = torch.tensor(self.slots, dtype=torch.long, device=self.write_B.device)
        if self.offset_B is None:
            self.offset_B = torch.zeros_like(self.write_B)

    def select(self, keep: list[int]) -> "SlotBatch | None":
        """Keep the rows at batch positions `keep`; the others' slots are freed."""
        if len(keep) == len(self.rows):
            return self
        kept = set(keep)
        self.cache.give_back([slot for b, slot in enumerate(self.slots) if b not in kept])
        if not keep:
            return None
        index = torch.tensor(keep, dtype=torch.long, device=self.write_B.device)
        return SlotBatch([self.rows[b] for b in keep], [self.slots[b] for b in keep], [self.writes[b] for b in keep],
                         self.next_ids_B[index], self.write_B[index], self.start_B[index],
                         self.sampling.select(keep), self.cache, offset_B=self.offset_B[index])

    def join(self, group: "SlotBatch") -> "SlotBatch":
        return SlotBatch(self.rows + group.rows, self.slots + group.slots, self.writes + group.writes,
                         torch.cat([self.next_ids_B, group.next_ids_B]), torch.cat([self.write_B, group.write_B]),
                         torch.cat([self.start_B, group.start_B]), self.sampling.concat(group.sampling), self.cache,
                         offset_B=torch.cat([self.offset_B, group.offset_B]))
