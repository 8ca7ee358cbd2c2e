"""Prefill for the `hf` decoder: requests' prompts through the model as one group, their first
tokens sampled, the group ready to join the running batch (decoder.py's module doc).

A group is left-padded (`batch.left_pad`) and prefilled with a fresh `DynamicCache`. Rows with
the same prompt (a GRPO group's samples) share one prefill: the distinct prompts go through the
model once, then each row takes a copy of its prompt's cache rows and last logits
(`batch.shared_prefill`). On the slot cache (`static_cache.py`) a group first reserves slots
(rows that do not fit wait for a later step; a row that cannot fit even in an idle engine is
answered with an abort saying why), then the prefill's keys and values are copied into them.

Multimodal rows (`DecodeRow.media`) are a group of their own, the text rows another joined after
them: their encoder tensors are collated (`relax.utils.multimodal.tensors.collate`) and their
M-RoPE position ids come from the model's `get_rope_index` (`BatchDecoder.media_inputs`); rows
with the same prompt and the same media object share one prefill. A row's next position is the
one after its prompt's largest (`next_pos`; on the slot cache, its `offset_B`).

Functions of a decoder (`DecoderCore`: its model, cache and the forward and sampling it runs),
kept apart from the decode loop so each reads on its own.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
from transformers import DynamicCache

from relax.backends.hf.batch import DynamicBatch, SlotBatch, left_pad, shared_prefill
from relax.backends.hf.routing import keep_prefill
from relax.backends.hf.rows import DecodeStats, RowState
from relax.backends.hf.sampling import SamplingBatch
from relax.backends.hf.static_cache import SlotCache, write_prefill
from relax.utils.multimodal.tensors import collate
from relax.utils.routing_replay import RouterTap


class DecoderCore(Protocol):
    """What prefilling uses of a `BatchDecoder` (decoder.py)."""

    model: Any
    device: torch.device
    pad_token_id: int
    can_join: bool
    slot_cache: SlotCache | None
    stats: DecodeStats
    routing: RouterTap | None  # --enable-return-routed-experts (routing.py)
    last_routing: torch.Tensor | None

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                cache: DynamicCache, **media: torch.Tensor) -> torch.Tensor: ...

    def sample(self, logits_BV: torch.Tensor, rows: list[int], states: list[RowState], sampling: SamplingBatch,
               finish: Callable[[int, dict], None]) -> tuple[torch.Tensor, list[int]]: ...

    def media_inputs(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, media: dict[str, torch.Tensor] | None
                     ) -> dict[str, torch.Tensor]: ...


def prefill(dec: DecoderCore, rows: list[int], states: list[RowState], finish: Callable[[int, dict], None], *,
            running: bool = False) -> tuple["DynamicBatch | SlotBatch | None", list[int]]:
    """Prefill rows as one left-padded group with a fresh cache; sample their first tokens.
    Returns the group's batch and the rows left waiting (no room in the slot cache yet).

    Rows with the same prompt (the n samples of a GRPO group) share one prefill: the distinct
    prompts go through the model once, then each row takes a copy of its prompt's cache rows
    and last logits (`shared_prefill`)."""
    waiting: list[int] = []
    media_rows = [i for i in rows if states[i].row.media]
    if media_rows:  # their own group (module doc); the text rows as another, joined after them
        text_rows = [i for i in rows if not states[i].row.media]
        batch, waiting = _prefill_media(dec, media_rows, states, finish, running)
        if text_rows:
            group, more = prefill(dec, text_rows, states, finish, running=running or batch is not None)
            waiting += more
            batch = group if batch is None else (batch if group is None else batch.join(group))
        return batch, waiting
    if dec.slot_cache is not None:
        rows, waiting = _fit_slots(dec, rows, states, finish, running)
        if not rows:
            return None, waiting
    firsts, index = shared_prefill([states[i].row.prompt_ids for i in rows]) if dec.can_join \
        else ([states[i].row.prompt_ids for i in rows], list(range(len(rows))))
    input_ids_UL, mask_UL, position_ids_UL = left_pad(firsts, dec.pad_token_id, dec.device)
    sampling = SamplingBatch.build([states[i].params for i in rows], dec.device)
    cache = DynamicCache(config=dec.model.config)
    logits_UV = dec.forward(input_ids_UL, mask_UL, position_ids_UL, cache)
    _keep_routing(dec, rows, states, index, [len(p) for p in firsts])
    if dec.slot_cache is not None:
        return _to_slots(dec, rows, states, finish, cache, logits_UV, mask_UL, index, sampling), waiting
    if len(firsts) < len(rows):
        index_B = torch.tensor(index, dtype=torch.long, device=dec.device)
        cache.batch_select_indices(index_B)  # each row's own copy: rows decode apart from here on
        logits_BV, mask_BL, position_ids_BL = logits_UV[index_B], mask_UL[index_B], position_ids_UL[index_B]
        dec.stats.prefill_rows_shared += len(rows) - len(firsts)
    else:
        logits_BV, mask_BL, position_ids_BL = logits_UV, mask_UL, position_ids_UL
    tokens_B, keep = dec.sample(logits_BV, rows, states, sampling, finish)
    group = DynamicBatch(rows, cache, mask_BL, tokens_B, position_ids_BL[:, -1] + 1, sampling)
    return group.select(keep), waiting


def _prefill_media(dec: DecoderCore, rows: list[int], states: list[RowState], finish: Callable[[int, dict], None],
                   running: bool = False) -> tuple["DynamicBatch | SlotBatch | None", list[int]]:
    """Prefill multimodal rows as one left-padded group (encoders + M-RoPE positions); rows with
    the same prompt and media object share one prefill. On the slot cache (a dense VL model)
    the group's keys and values go to the rows' slots, each row's position offset with them
    (static_cache's module doc); rows without room wait."""
    waiting: list[int] = []
    if dec.slot_cache is not None:
        rows, waiting = _fit_slots(dec, rows, states, finish, running)
        if not rows:
            return None, waiting
    keys = [(tuple(states[i].row.prompt_ids), id(states[i].row.media)) for i in rows]
    distinct = list(dict.fromkeys(keys))
    index = [distinct.index(k) for k in keys]
    firsts = [rows[keys.index(k)] for k in distinct]
    ids_UL, mask_UL, _ = left_pad([states[i].row.prompt_ids for i in firsts], dec.pad_token_id, dec.device)
    inputs = dec.media_inputs(ids_UL, mask_UL, collate([states[i].row.media for i in firsts]))
    positions_3UL = inputs.pop("position_ids")
    cache = DynamicCache(config=dec.model.config)
    logits_UV = dec.forward(ids_UL, mask_UL, positions_3UL, cache, **inputs)
    _keep_routing(dec, rows, states, index, [len(states[i].row.prompt_ids) for i in firsts])
    next_pos_U = positions_3UL.amax(dim=(0, 2)) + 1  # the position after each prompt
    if dec.slot_cache is not None:
        sampling = SamplingBatch.build([states[i].params for i in rows], dec.device)
        group = _to_slots(dec, rows, states, finish, cache, logits_UV, mask_UL, index, sampling)
        if group is not None:  # position after the prompt minus the prompt's length in tokens
            index_B = torch.tensor([index[rows.index(r)] for r in group.rows], dtype=torch.long,
                                   device=dec.device)
            group.offset_B = (next_pos_U - mask_UL.sum(dim=1)).index_select(0, index_B)
        return group, waiting
    if len(firsts) < len(rows):
        index_B = torch.tensor(index, dtype=torch.long, device=dec.device)
        cache.batch_select_indices(index_B)
        logits_UV, mask_UL, next_pos_U = logits_UV[index_B], mask_UL[index_B], next_pos_U[index_B]
        dec.stats.prefill_rows_shared += len(rows) - len(firsts)
    sampling = SamplingBatch.build([states[i].params for i in rows], dec.device)
    tokens_B, keep = dec.sample(logits_UV, rows, states, sampling, finish)
    return DynamicBatch(rows, cache, mask_UL, tokens_B, next_pos_U, sampling).select(keep), waiting


def _keep_routing(dec: DecoderCore, rows: list[int], states: list[RowState], index: list[int],
                  prompt_lengths: list[int]) -> None:
    """The prefill's routed experts into its rows' records, before their first tokens are sampled
    (a row may finish at its first token)."""
    if dec.routing is not None:
        keep_prefill(states, rows, index, prompt_lengths, dec.last_routing, dec.routing.shape)


def _fit_slots(dec: DecoderCore, rows: list[int], states: list[RowState], finish: Callable[[int, dict], None],
               running: bool) -> tuple[list[int], list[int]]:
    """The rows that get a slot now (in order) and the ones that wait. A row that cannot fit
    even in an idle engine is answered with an abort saying why."""
    width = max(len(states[i].row.prompt_ids) for i in rows)  # the group's left-padded prompt
    need = width + max(states[i].max_new for i in rows)
    fit = dec.slot_cache.reserve(len(rows), need)
    if fit == 0 and not running:
        budget = dec.slot_cache.token_budget()
        for i in rows:
            finish(i, {"type": "abort", "message": (
                f"the request needs {need} KV cache token slots and the engine has {budget}: raise "
                "--max-total-tokens (--sglang-max-total-tokens) or lower max_new_tokens")})
        return [], []
    return rows[:fit], rows[fit:]


def _to_slots(dec: DecoderCore, rows: list[int], states: list[RowState], finish: Callable[[int, dict], None],
              cache: DynamicCache, logits_UV: torch.Tensor, mask_UL: torch.Tensor, index: list[int],
              sampling: SamplingBatch) -> "SlotBatch | None":
    """Copy the prefill's keys/values into the rows' slots; sample their first tokens."""
    slots = dec.slot_cache.take(len(rows))
    index_B = torch.tensor(index, dtype=torch.long, device=dec.device)
    slots_B = torch.tensor(slots, dtype=torch.long, device=dec.device)
    write_prefill(dec.slot_cache, [(layer.keys, layer.values) for layer in cache.layers], slots_B, index_B)
    width = mask_UL.shape[1]
    start_B = (width - mask_UL.sum(dim=1)).index_select(0, index_B)
    if len(set(index)) < len(rows):
        dec.stats.prefill_rows_shared += len(rows) - len(set(index))
    logits_BV = logits_UV.index_select(0, index_B)
    tokens_B, keep = dec.sample(logits_BV, rows, states, sampling, finish)
    group = SlotBatch(rows, slots, [width] * len(rows), tokens_B,
                      torch.full((len(rows),), width, dtype=torch.long, device=dec.device), start_B, sampling,
                      dec.slot_cache, slots_B)
    return group.select(keep)
