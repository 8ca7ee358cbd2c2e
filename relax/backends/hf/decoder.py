"""Continuous batched decoding with one shared KV cache (the `hf` engine's hot loop).

Two cache layouts share the loop below. Llama-family and dense VL models (`static_cache.static_decode_supported`)
decode on the slot cache of `static_cache.py` (`_SlotBatch`: each row owns a slot of a
preallocated cache written in place, steps replayed as CUDA graphs on a GPU; a row that does not
fit the cache waits for a slot). Other models use transformers' `DynamicCache` (`_Batch`), as
described next; the prefill, sampling, finishing and aborting are the same for both.

Algorithm: the running batch is a set of rows over one transformers `DynamicCache`, each row
left-padded (attention mask 0 on padding, position ids counted from the row's own first real
token, so padding never changes a row's result). One loop iteration gives every running row
one token:
  1. `before_step()` (the scheduler blocks there for an in-place pause), then rows whose
     `abort_event` is set are answered with finish_reason abort and dropped;
  2. one decode forward for all running rows: `model(input_ids_B1, attention_mask_BT,
     position_ids_B1, past_key_values, use_cache=True)`;
  3. requests handed over by `admit(running)` (taken from the scheduler's queue at this step
     boundary) are left-padded and prefilled as one group with a fresh cache, and the group
     JOINS the running batch: `merge_caches` left-pads the shorter cache (keys/values zeros,
     mask 0) to the longer one's length and concatenates the two along the batch dimension.
Rows finish independently (EOS, `stop_token_ids`, `stop` strings, `max_new_tokens`, context
length, abort) and are answered at once; finished rows are dropped from every per-row tensor
and the KV cache, and cache columns that are padding for every remaining row are trimmed
(`trim_left_padding`), so the cache never grows past the longest live row. A group's prefill
is a separate forward from the running rows' decode forward (simplification: no packed
prefill+decode forward), so a step with a join costs two forwards.

True on-policy (`true_on_policy=True`, the server's `--rl-on-policy-target fsdp`): tokens are
still sampled from the decoding logits above, but when a row finishes its reported log-probs
are recomputed by one full forward of that row alone (prompt + output, no padding, no cache)
through `relax.algorithms.logprobs` — the function the fsdp trainer scores rows with in
`--true-on-policy-mode` — so engine and trainer log-probs are bitwise equal. Cost: one extra
forward per finished row. The recompute uses the weights loaded when the row finishes.

Multimodal rows (`DecodeRow.media`: a VL / Omni model's encoder tensors, `relax.utils.multimodal.processor`)
are prefilled as their own left-padded group, the images (and audio) through their encoders and M-RoPE
position ids from the model's `get_rope_index` (row by row, on real tokens); rows with the same
prompt and the same media object (a GRPO group's samples) share one prefill, as text rows do.
The group then joins like any other. A decode step feeds
one text token per row, whose three M-RoPE components are equal: the row's position after its
prompt (`max(prompt positions) + 1`, counting on), which is what `next_pos_B` holds (on the slot
cache, a dense VL model's, the row's `offset_B` says it: static_cache's module doc).
A VL / Omni model's media placeholder tokens (`banned_token_ids`: `<|image_pad|>`, `<|vision_start|>`,
`<|audio_pad|>`, ...) are never sampled (an emitted one would be read as an image slot by the trainer and the
next turn); the reported log-probs stay those of the model's whole distribution at the row's
temperature (`unbanned_logprobs`), the ones the trainer computes.

Joining needs plain `DynamicLayer` cache layers; for models whose cache has other layer kinds
(sliding window, linear attention) `can_join` is False and `admit` is never called: new
requests then wait for the next batch.

`BatchDecoder.run` is synchronous and meant to run in a worker thread; it calls
`on_finish(i, result)` the moment row i finishes (i counts rows in admission order: the
initial rows, then each admitted group), so the server can answer it before the rest of the
batch is done. Each forward holds `step_lock`, which weight loading also takes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from relax.algorithms.logprobs import row_response_log_probs
from relax.backends.hf.sampling import SamplingBatch, SamplingParams, apply_penalties, sample_next_tokens
from relax.backends.hf.static_cache import GraphRunner, SlotCache, kv_shape, static_decode_supported, write_prefill
from relax.utils.multimodal.processor import rope_positions

ABORT_MESSAGE = "request aborted"
REGEX_WINDOW = 64  # output tokens whose text a stop_regex is searched in


@dataclass
class DecodeRow:
    """One sequence to decode. Set `abort_event` (from any thread) to stop it at the next step."""

    prompt_ids: list[int]
    params: SamplingParams
    abort_event: threading.Event = field(default_factory=threading.Event)
    abort_message: str = ABORT_MESSAGE
    media: dict[str, torch.Tensor] | None = None  # encoder tensors of a multimodal prompt (pixel_values, ...)


@dataclass
class RowResult:
    """What one row produced. `finish_reason` has SGLang's shape: {"type": "stop"|"length"|"abort", ...}."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: dict[str, Any]
    text: str
    input_logprobs: list[float | None] | None = None  # per prompt token (None at position 0), when asked


@dataclass
class DecodeStats:
    """Counters read by /get_server_info (written by the decode thread only).

    `recent_batch_sizes` holds the running batch size right after each admission: one entry
    when a batch starts from idle (`batches`) and one per group that joins a running batch
    (`joins`; `joined_requests` counts their rows). A burst of 128 that starts with 5 and
    then joins twice reads [5, 60, 128].
    """

    forward_calls: int = 0
    batches: int = 0
    joins: int = 0
    joined_requests: int = 0
    generated_tokens: int = 0
    prefill_rows_shared: int = 0  # rows whose prompt another row of the same prefill computed
    busy_seconds: float = 0.0  # wall time inside batched prefill/decode (forwards, sampling, cache merges)
    recent_batch_sizes: list[int] = field(default_factory=list)

    def record_batch(self, size: int) -> None:
        self.batches += 1
        self._record_size(size)

    def record_join(self, running_size: int, joined: int) -> None:
        self.joins += 1
        self.joined_requests += joined
        self._record_size(running_size)

    def _record_size(self, size: int) -> None:
        self.recent_batch_sizes = (self.recent_batch_sizes + [size])[-64:]


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


def unbanned_logprobs(logprobs_B: torch.Tensor, chosen_logits_B: torch.Tensor, banned_BK: torch.Tensor,
                      temperature_B: torch.Tensor) -> torch.Tensor:
    """Log-probs under the full distribution from those sampled with K tokens masked out.

    Masked: lp' = l_t/T - LSE_u (LSE over the allowed tokens); full: lp = l_t/T - logaddexp(LSE_u,
    LSE_b) = lp' - softplus(LSE_b - LSE_u), with LSE_b over the banned logits / T."""
    lse_u = chosen_logits_B.float() / temperature_B - logprobs_B
    lse_b = torch.logsumexp(banned_BK.float() / temperature_B[:, None], dim=-1)
    return logprobs_B - torch.nn.functional.softplus(lse_b - lse_u)


def cache_supports_join(config: Any) -> bool:
    """True when the model's DynamicCache is made only of plain full-attention layers (mergeable)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


@dataclass
class _Batch:
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

    def select(self, keep: list[int]) -> "_Batch | None":
        """Keep only the rows at batch positions `keep` (None when empty); trims shared padding."""
        if not keep:
            return None
        if len(keep) == len(self.rows):
            return self
        index = torch.tensor(keep, dtype=torch.long, device=self.mask_BT.device)
        self.cache.batch_select_indices(index)
        mask_BT = trim_left_padding(self.cache, self.mask_BT[index])
        return _Batch([self.rows[b] for b in keep], self.cache, mask_BT, self.next_ids_B[index],
                      self.next_pos_B[index], self.sampling.select(keep))

    def join(self, group: "_Batch") -> "_Batch":
        """Append a freshly prefilled group's rows to this batch (caches merged)."""
        cache, mask_BT = merge_caches(self.cache, self.mask_BT, group.cache, group.mask_BT)
        return _Batch(self.rows + group.rows, cache, mask_BT, torch.cat([self.next_ids_B, group.next_ids_B]),
                      torch.cat([self.next_pos_B, group.next_pos_B]), self.sampling.concat(group.sampling))


@dataclass
class _SlotBatch:
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

    def select(self, keep: list[int]) -> "_SlotBatch | None":
        """Keep the rows at batch positions `keep`; the others' slots are freed."""
        if len(keep) == len(self.rows):
            return self
        kept = set(keep)
        self.cache.give_back([slot for b, slot in enumerate(self.slots) if b not in kept])
        if not keep:
            return None
        index = torch.tensor(keep, dtype=torch.long, device=self.write_B.device)
        return _SlotBatch([self.rows[b] for b in keep], [self.slots[b] for b in keep], [self.writes[b] for b in keep],
                          self.next_ids_B[index], self.write_B[index], self.start_B[index],
                          self.sampling.select(keep), self.cache, offset_B=self.offset_B[index])

    def join(self, group: "_SlotBatch") -> "_SlotBatch":
        return _SlotBatch(self.rows + group.rows, self.slots + group.slots, self.writes + group.writes,
                          torch.cat([self.next_ids_B, group.next_ids_B]), torch.cat([self.write_B, group.write_B]),
                          torch.cat([self.start_B, group.start_B]), self.sampling.concat(group.sampling), self.cache,
                          offset_B=torch.cat([self.offset_B, group.offset_B]))


class _RowState:
    """Outputs so far and the finish checks of one row."""

    def __init__(self, row: DecodeRow, eos_ids: frozenset[int], max_new: int, tokenizer: Any):
        self.row, self.params, self.tokenizer = row, row.params, tokenizer
        self.eos_ids = frozenset() if row.params.ignore_eos else eos_ids
        self.max_new = max_new
        self.stop_ids = sorted(self.eos_ids | set(row.params.stop_token_ids))
        self.stop_window = max((len(s) for s in row.params.stop), default=0) + 2
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []

    def append(self, token: int, logprob: float) -> dict[str, Any] | None:
        """Record one token; return the finish reason if the row is done."""
        self.output_ids.append(token)
        self.logprobs.append(logprob)
        if len(self.output_ids) >= self.params.min_new_tokens:
            if token in self.eos_ids or token in self.params.stop_token_ids:
                return {"type": "stop", "matched": token}
            if self.params.stop:
                tail = self.tokenizer.decode(self.output_ids[-self.stop_window:])
                for stop in self.params.stop:
                    if stop in tail:
                        return {"type": "stop", "matched": stop}
            if self.params.stop_regex:  # over the last REGEX_WINDOW tokens' text
                tail = self.tokenizer.decode(self.output_ids[-REGEX_WINDOW:])
                for pattern in self.params.stop_regex:
                    found = pattern.search(tail)
                    if found and found.group(0):
                        return {"type": "stop", "matched": found.group(0)}
        if len(self.output_ids) >= self.max_new:
            return {"type": "length", "length": len(self.output_ids)}
        return None

    def result(self, finish_reason: dict[str, Any]) -> RowResult:
        ids, matched = self.output_ids, finish_reason.get("matched")
        trim = finish_reason["type"] == "stop" and not self.params.no_stop_trim
        if trim and isinstance(matched, int):
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens)
        if trim and isinstance(matched, str) and matched in text:
            text = text[:text.index(matched)]
        return RowResult(list(self.output_ids), list(self.logprobs), finish_reason, text)


class BatchDecoder:
    """Decode `DecodeRow`s with a transformers causal LM, with continuous batching (see module doc)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, device: torch.device | str,
                 eos_token_ids: Sequence[int], max_context_len: int, pad_token_id: int = 0,
                 step_lock: threading.Lock | None = None, seed: int | None = None, true_on_policy: bool = False,
                 max_running_requests: int = 256, max_total_tokens: int | None = None, cuda_graphs: bool = True,
                 cuda_graph_max_bs: int | None = None, static_cache: bool = True,
                 banned_token_ids: Sequence[int] = ()):
        self.model, self.tokenizer = model, tokenizer
        self.banned_ids = torch.tensor(sorted(set(banned_token_ids)), dtype=torch.long, device=device) \
            if banned_token_ids else None
        self.true_on_policy = true_on_policy
        self.device = torch.device(device)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.max_context_len = max_context_len
        self.pad_token_id = pad_token_id
        self.step_lock = step_lock or threading.Lock()
        self.shared_generator = torch.Generator(device=self.device)
        if seed is None:
            self.shared_generator.seed()
        else:
            self.shared_generator.manual_seed(seed)
        self.can_join = cache_supports_join(model.config)
        self.stats = DecodeStats()
        # The slot cache + CUDA graphs path (static_cache.py) for the models it knows; the rest
        # decode through transformers' DynamicCache (`_Batch`).
        why_not = static_decode_supported(model) if static_cache else "turned off"
        self.slot_cache: SlotCache | None = None
        self.runner: GraphRunner | None = None
        if why_not is None:
            self.slot_cache = SlotCache(kv_shape(model), self.device, max_rows=max_running_requests,
                                        max_total_tokens=max_total_tokens)
            self.runner = GraphRunner(model, self.slot_cache, max_rows=max_running_requests, use_graphs=cuda_graphs,
                                      graph_max_rows=cuda_graph_max_bs)
        self.static_path_note = why_not
        if self.device.type == "cuda":
            # cuDNN attention builds a plan per new shape (and thread); a decode step's shapes are
            # new nearly every step (the KV length grows, batches join and finish): ~3.5x slower.
            torch.backends.cuda.enable_cudnn_sdp(False)

    def release_cache(self) -> None:
        """Free the KV slot cache and drop captured graphs (memory release; weights moved)."""
        if self.slot_cache is not None:
            self.slot_cache.release()
            self.runner.reset()

    def max_new_tokens(self, row: DecodeRow) -> int:
        room = self.max_context_len - len(row.prompt_ids)
        wanted = row.params.max_new_tokens
        return max(0, room if wanted is None else min(wanted, room))

    def media_inputs(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor, media: dict[str, torch.Tensor] | None
                     ) -> dict[str, torch.Tensor]:
        """Forward kwargs of a multimodal row: its encoder tensors and M-RoPE position ids."""
        if not media:
            return {}
        media = {k: v.to(self.device) for k, v in media.items()}
        return {**media, "position_ids": rope_positions(self.model, ids_BL, mask_BL, media)}

    def prompt_logprobs(self, prompts: Sequence[Sequence[int]], *, rows_per_forward: int = 16,
                        media: Sequence[dict[str, torch.Tensor] | None] | None = None) -> list[list[float | None]]:
        """Log-prob of every prompt token given the tokens before it (raw logits, no temperature):
        `[None, logp(t1 | t0), logp(t2 | t0 t1), ...]` per prompt. Right-padded forwards without a
        cache, `rows_per_forward` prompts at a time, each under `step_lock`; a prompt with `media`
        goes alone, with its encoder tensors."""
        if media is not None and any(media):
            return [self.prompt_logprobs([p], media=None)[0] if not m else self._media_prompt_logprobs(p, m)
                    for p, m in zip(prompts, media)]
        out: list[list[float | None]] = []
        for start in range(0, len(prompts), rows_per_forward):
            chunk = [list(p) for p in prompts[start:start + rows_per_forward]]
            width = max(len(p) for p in chunk)
            ids_BL = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
            mask_BL = torch.zeros((len(chunk), width), dtype=torch.long)
            for b, p in enumerate(chunk):
                ids_BL[b, :len(p)], mask_BL[b, :len(p)] = torch.tensor(p, dtype=torch.long), 1
            ids_BL, mask_BL = ids_BL.to(self.device), mask_BL.to(self.device)
            with torch.inference_mode(), self.step_lock:
                logits_BLV = self.model(input_ids=ids_BL, attention_mask=mask_BL, use_cache=False).logits
                logp_BL = torch.log_softmax(logits_BLV[:, :-1].float(), dim=-1).gather(-1, ids_BL[:, 1:, None])
            for b, p in enumerate(chunk):
                out.append([None] + logp_BL[b, :len(p) - 1, 0].cpu().tolist())
        return out

    def _media_prompt_logprobs(self, prompt: Sequence[int], media: dict[str, torch.Tensor]) -> list[float | None]:
        ids_1L = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        mask_1L = torch.ones_like(ids_1L)
        with torch.inference_mode(), self.step_lock:
            logits_1LV = self.model(input_ids=ids_1L, attention_mask=mask_1L, use_cache=False,
                                    **self.media_inputs(ids_1L, mask_1L, media)).logits
            logp_L = torch.log_softmax(logits_1LV[0, :-1].float(), dim=-1).gather(-1, ids_1L[0, 1:, None])[:, 0]
        return [None] + logp_L.cpu().tolist()

    def run(self, rows: Sequence[DecodeRow], *, on_finish: Callable[[int, RowResult], None] | None = None,
            before_step: Callable[[], None] | None = None,
            admit: Callable[[int], Sequence[DecodeRow]] | None = None) -> list[RowResult]:
        """Decode `rows`, plus the rows `admit(running)` hands over at each step boundary while
        the batch runs (they join it). Returns every row's result in admission order."""
        states: list[_RowState] = []
        results: list[RowResult | None] = []

        def finish(i: int, reason: dict[str, Any]) -> None:
            results[i] = states[i].result(reason)
            if self.true_on_policy and results[i].output_ids:
                results[i].output_logprobs = self._rescore(states[i])
            if on_finish is not None:
                on_finish(i, results[i])

        def add(new_rows: Sequence[DecodeRow]) -> list[int]:
            """Register rows; answer those with nothing to do; return the ones to prefill."""
            todo = []
            for row in new_rows:
                i = len(states)
                states.append(_RowState(row, self.eos_token_ids, self.max_new_tokens(row), self.tokenizer))
                results.append(None)
                if states[i].max_new == 0 and not row.abort_event.is_set():
                    finish(i, {"type": "length", "length": 0})
                else:
                    todo.append(i)
            return todo

        batch: _Batch | None = None
        waiting = add(rows)
        started = False
        while waiting or batch is not None:
            if before_step is not None:
                before_step()
            if batch is not None and admit is not None and self.can_join:
                waiting += add(admit(len(batch.rows)))
            start = time.perf_counter()
            with torch.inference_mode():
                if batch is not None:
                    batch = batch.select([b for b, i in enumerate(batch.rows)
                                          if not self._finish_if_aborted(states[i], i, finish)])
                waiting = [i for i in waiting if not self._finish_if_aborted(states[i], i, finish)]
                if batch is not None:
                    batch = self._decode_step(batch, states, finish)
                if waiting:
                    running = len(batch.rows) if batch is not None else 0
                    asked = len(waiting)
                    group, waiting = self._prefill(waiting, states, finish, running=batch is not None)
                    batch = group if batch is None else (batch if group is None else batch.join(group))
                    prefilled = asked - len(waiting)
                    if prefilled and started:
                        self.stats.record_join(running + prefilled, prefilled)
                    elif prefilled:
                        self.stats.record_batch(prefilled)
                    started = started or bool(prefilled)
            self.stats.busy_seconds += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: DynamicCache, **media: torch.Tensor) -> torch.Tensor:
        with self.step_lock:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1, **media)
        self.stats.forward_calls += 1
        return out.logits[:, -1]

    def _prefill(self, rows: list[int], states: list[_RowState], finish: Callable[[int, dict], None], *,
                 running: bool = False) -> tuple["_Batch | _SlotBatch | None", list[int]]:
        """Prefill rows as one left-padded group with a fresh cache; sample their first tokens.
        Returns the group's batch and the rows left waiting (no room in the slot cache yet).

        Rows with the same prompt (the n samples of a GRPO group) share one prefill: the distinct
        prompts go through the model once, then each row takes a copy of its prompt's cache rows
        and last logits (`shared_prefill`)."""
        waiting: list[int] = []
        media_rows = [i for i in rows if states[i].row.media]
        if media_rows:  # their own group (module doc); the text rows as another, joined after them
            text_rows = [i for i in rows if not states[i].row.media]
            batch, waiting = self._prefill_media(media_rows, states, finish, running)
            if text_rows:
                group, more = self._prefill(text_rows, states, finish, running=running or batch is not None)
                waiting += more
                batch = group if batch is None else (batch if group is None else batch.join(group))
            return batch, waiting
        if self.slot_cache is not None:
            rows, waiting = self._fit_slots(rows, states, finish, running)
            if not rows:
                return None, waiting
        firsts, index = shared_prefill([states[i].row.prompt_ids for i in rows]) if self.can_join \
            else ([states[i].row.prompt_ids for i in rows], list(range(len(rows))))
        input_ids_UL, mask_UL, position_ids_UL = left_pad(firsts, self.pad_token_id, self.device)
        sampling = SamplingBatch.build([states[i].params for i in rows], self.device)
        cache = DynamicCache(config=self.model.config)
        logits_UV = self._forward(input_ids_UL, mask_UL, position_ids_UL, cache)
        if self.slot_cache is not None:
            return self._to_slots(rows, states, finish, cache, logits_UV, mask_UL, index, sampling), waiting
        if len(firsts) < len(rows):
            index_B = torch.tensor(index, dtype=torch.long, device=self.device)
            cache.batch_select_indices(index_B)  # each row's own copy: rows decode apart from here on
            logits_BV, mask_BL, position_ids_BL = logits_UV[index_B], mask_UL[index_B], position_ids_UL[index_B]
            self.stats.prefill_rows_shared += len(rows) - len(firsts)
        else:
            logits_BV, mask_BL, position_ids_BL = logits_UV, mask_UL, position_ids_UL
        tokens_B, keep = self._sample(logits_BV, rows, states, sampling, finish)
        group = _Batch(rows, cache, mask_BL, tokens_B, position_ids_BL[:, -1] + 1, sampling)
        return group.select(keep), waiting

    def _prefill_media(self, rows: list[int], states: list[_RowState], finish: Callable[[int, dict], None],
                       running: bool = False) -> tuple["_Batch | _SlotBatch | None", list[int]]:
        """Prefill multimodal rows as one left-padded group (encoders + M-RoPE positions); rows with
        the same prompt and media object share one prefill. On the slot cache (a dense VL model)
        the group's keys and values go to the rows' slots, each row's position offset with them
        (static_cache's module doc); rows without room wait."""
        from relax.utils.multimodal.processor import collate

        waiting: list[int] = []
        if self.slot_cache is not None:
            rows, waiting = self._fit_slots(rows, states, finish, running)
            if not rows:
                return None, waiting
        keys = [(tuple(states[i].row.prompt_ids), id(states[i].row.media)) for i in rows]
        distinct = list(dict.fromkeys(keys))
        index = [distinct.index(k) for k in keys]
        firsts = [rows[keys.index(k)] for k in distinct]
        ids_UL, mask_UL, _ = left_pad([states[i].row.prompt_ids for i in firsts], self.pad_token_id, self.device)
        inputs = self.media_inputs(ids_UL, mask_UL, collate([states[i].row.media for i in firsts]))
        positions_3UL = inputs.pop("position_ids")
        cache = DynamicCache(config=self.model.config)
        logits_UV = self._forward(ids_UL, mask_UL, positions_3UL, cache, **inputs)
        next_pos_U = positions_3UL.amax(dim=(0, 2)) + 1  # the position after each prompt
        if self.slot_cache is not None:
            sampling = SamplingBatch.build([states[i].params for i in rows], self.device)
            group = self._to_slots(rows, states, finish, cache, logits_UV, mask_UL, index, sampling)
            if group is not None:  # position after the prompt minus the prompt's length in tokens
                index_B = torch.tensor([index[rows.index(r)] for r in group.rows], dtype=torch.long,
                                       device=self.device)
                group.offset_B = (next_pos_U - mask_UL.sum(dim=1)).index_select(0, index_B)
            return group, waiting
        if len(firsts) < len(rows):
            index_B = torch.tensor(index, dtype=torch.long, device=self.device)
            cache.batch_select_indices(index_B)
            logits_UV, mask_UL, next_pos_U = logits_UV[index_B], mask_UL[index_B], next_pos_U[index_B]
            self.stats.prefill_rows_shared += len(rows) - len(firsts)
        sampling = SamplingBatch.build([states[i].params for i in rows], self.device)
        tokens_B, keep = self._sample(logits_UV, rows, states, sampling, finish)
        return _Batch(rows, cache, mask_UL, tokens_B, next_pos_U, sampling).select(keep), waiting

    def _fit_slots(self, rows: list[int], states: list[_RowState], finish: Callable[[int, dict], None],
                   running: bool) -> tuple[list[int], list[int]]:
        """The rows that get a slot now (in order) and the ones that wait. A row that cannot fit
        even in an idle engine is answered with an abort saying why."""
        width = max(len(states[i].row.prompt_ids) for i in rows)  # the group's left-padded prompt
        need = width + max(states[i].max_new for i in rows)
        fit = self.slot_cache.reserve(len(rows), need)
        if fit == 0 and not running:
            budget = self.slot_cache.token_budget()
            for i in rows:
                finish(i, {"type": "abort", "message": (
                    f"the request needs {need} KV cache token slots and the engine has {budget}: raise "
                    "--max-total-tokens (--sglang-max-total-tokens) or lower max_new_tokens")})
            return [], []
        return rows[:fit], rows[fit:]

    def _to_slots(self, rows: list[int], states: list[_RowState], finish: Callable[[int, dict], None],
                  cache: DynamicCache, logits_UV: torch.Tensor, mask_UL: torch.Tensor, index: list[int],
                  sampling: SamplingBatch) -> "_SlotBatch | None":
        """Copy the prefill's keys/values into the rows' slots; sample their first tokens."""
        slots = self.slot_cache.take(len(rows))
        index_B = torch.tensor(index, dtype=torch.long, device=self.device)
        slots_B = torch.tensor(slots, dtype=torch.long, device=self.device)
        write_prefill(self.slot_cache, [(layer.keys, layer.values) for layer in cache.layers], slots_B, index_B)
        width = mask_UL.shape[1]
        start_B = (width - mask_UL.sum(dim=1)).index_select(0, index_B)
        if len(set(index)) < len(rows):
            self.stats.prefill_rows_shared += len(rows) - len(set(index))
        logits_BV = logits_UV.index_select(0, index_B)
        tokens_B, keep = self._sample(logits_BV, rows, states, sampling, finish)
        group = _SlotBatch(rows, slots, [width] * len(rows), tokens_B,
                           torch.full((len(rows),), width, dtype=torch.long, device=self.device), start_B, sampling,
                           self.slot_cache, slots_B)
        return group.select(keep)

    def _decode_step(self, batch: "_Batch | _SlotBatch", states: list[_RowState], finish: Callable[[int, dict], None]
                     ) -> "_Batch | _SlotBatch | None":
        """One forward for every running row (each feeds its pending token); sample the next ones."""
        if isinstance(batch, _SlotBatch):
            with self.step_lock:
                logits_BV = self.runner.step(batch.slots_B, batch.next_ids_B, batch.write_B, batch.start_B,
                                             max(batch.slots), max(batch.writes), batch.offset_B)
            self.stats.forward_calls += 1
            tokens_B, keep = self._sample(logits_BV, batch.rows, states, batch.sampling, finish)
            batch.next_ids_B, batch.write_B = tokens_B, batch.write_B + 1
            batch.writes = [w + 1 for w in batch.writes]
            return batch.select(keep)
        mask_BT = torch.cat([batch.mask_BT, batch.mask_BT.new_ones((len(batch.rows), 1))], dim=1)
        logits_BV = self._forward(batch.next_ids_B[:, None], mask_BT, batch.next_pos_B[:, None], batch.cache)
        tokens_B, keep = self._sample(logits_BV, batch.rows, states, batch.sampling, finish)
        batch.mask_BT, batch.next_ids_B, batch.next_pos_B = mask_BT, tokens_B, batch.next_pos_B + 1
        return batch.select(keep)

    def _sample(self, logits_BV: torch.Tensor, rows: list[int], states: list[_RowState], sampling: SamplingBatch,
                finish: Callable[[int, dict], None]) -> tuple[torch.Tensor, list[int]]:
        """Draw one token per row, record it, answer finished rows. Returns (tokens_B, kept positions)."""
        self._apply_penalizers(logits_BV, [states[i] for i in rows])
        if self.banned_ids is not None:
            banned_BK = logits_BV[:, self.banned_ids].clone()
            logits_BV[:, self.banned_ids] = float("-inf")
        tokens_B, logprobs_B = sample_next_tokens(logits_BV, sampling, self.shared_generator)
        if self.banned_ids is not None:
            chosen_B = logits_BV.gather(-1, tokens_B[:, None])[:, 0]  # greedy rows: temperature_B is 1
            logprobs_B = unbanned_logprobs(logprobs_B, chosen_B, banned_BK, sampling.temperature_B)
        self.stats.generated_tokens += len(rows)
        keep = []
        for b, (i, token, logprob) in enumerate(zip(rows, tokens_B.tolist(), logprobs_B.tolist())):
            reason = states[i].append(token, logprob)
            if reason is None:
                keep.append(b)
            else:
                finish(i, reason)
        return tokens_B, keep

    def _rescore(self, state: _RowState) -> list[float]:
        """The row's output log-probs from one unpadded full forward (true on-policy; module doc)."""
        params = state.params
        with self.step_lock, torch.inference_mode():
            tokens = state.row.prompt_ids + state.output_ids
            ids_1L = torch.tensor([tokens], dtype=torch.long, device=self.device)
            logp_R = row_response_log_probs(self.model, tokens, len(state.output_ids),
                                            1.0 if params.is_greedy else params.temperature, self.device,
                                            self.media_inputs(ids_1L, torch.ones_like(ids_1L), state.row.media))
        self.stats.forward_calls += 1
        return logp_R.tolist()

    def _apply_penalizers(self, logits_BV: torch.Tensor, states: list[_RowState]) -> None:
        """SGLang's penalizers: repetition/frequency/presence penalties and the logit bias, and no
        stop token before min_new_tokens."""
        for b, state in enumerate(states):
            if state.params.has_penalties:
                apply_penalties(logits_BV[b], state.params, state.row.prompt_ids, state.output_ids)
            if state.stop_ids and len(state.output_ids) < state.params.min_new_tokens:
                logits_BV[b, state.stop_ids] = float("-inf")

    @staticmethod
    def _finish_if_aborted(state: _RowState, i: int, finish: Callable[[int, dict], None]) -> bool:
        if not state.row.abort_event.is_set():
            return False
        finish(i, {"type": "abort", "message": state.row.abort_message})
        return True
