"""Batched autoregressive decoding with one shared KV cache (the `hf` engine's hot loop).

Algorithm: left-pad the prompts of a batch to a common length (attention mask 0 on the
padding, position ids counted from each row's first real token, so padding never changes a
row's result), run one prefill forward over the whole batch, then one decode forward per
step for all rows still running: `model(input_ids_B1, attention_mask_BT, position_ids_B1,
past_key_values, use_cache=True)`. Rows finish independently (EOS, `stop_token_ids`, `stop`
strings, `max_new_tokens`, abort); finished rows are dropped from the batch and from the KV
cache (`DynamicCache.batch_select_indices`), so the batch only shrinks. New requests wait for
the next batch (simplification: no joining mid-batch, which would need KV caches of
different lengths merged).

`BatchDecoder.run` is synchronous and meant to run in a worker thread; it calls
`on_finish(i, result)` the moment row i finishes so the server can answer it before the rest
of the batch is done, and `before_step()` before every forward (the scheduler blocks there
for an in-place pause). Each forward holds `step_lock`, which weight loading also takes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from relax.backends.hf.sampling import SamplingBatch, SamplingParams, sample_next_tokens

ABORT_MESSAGE = "request aborted"


@dataclass
class DecodeRow:
    """One sequence to decode. Set `abort_event` (from any thread) to stop it at the next step."""

    prompt_ids: list[int]
    params: SamplingParams
    abort_event: threading.Event = field(default_factory=threading.Event)
    abort_message: str = ABORT_MESSAGE


@dataclass
class RowResult:
    """What one row produced. `finish_reason` has SGLang's shape: {"type": "stop"|"length"|"abort", ...}."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: dict[str, Any]
    text: str


@dataclass
class DecodeStats:
    """Counters read by /get_server_info (written by the decode thread only)."""

    forward_calls: int = 0
    batches: int = 0
    generated_tokens: int = 0
    busy_seconds: float = 0.0  # wall time inside batched prefill/decode (model compute + sampling)
    recent_batch_sizes: list[int] = field(default_factory=list)

    def record_batch(self, size: int) -> None:
        self.batches += 1
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
    """Decode batches of `DecodeRow`s with a transformers causal LM (see module doc)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, device: torch.device | str,
                 eos_token_ids: Sequence[int], max_context_len: int, pad_token_id: int = 0,
                 step_lock: threading.Lock | None = None, seed: int | None = None):
        self.model, self.tokenizer = model, tokenizer
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
        self.stats = DecodeStats()

    def max_new_tokens(self, row: DecodeRow) -> int:
        room = self.max_context_len - len(row.prompt_ids)
        wanted = row.params.max_new_tokens
        return max(0, room if wanted is None else min(wanted, room))

    def run(self, rows: Sequence[DecodeRow], *, on_finish: Callable[[int, RowResult], None] | None = None,
            before_step: Callable[[], None] | None = None) -> list[RowResult]:
        """Decode all rows together; returns their results in order."""
        results: list[RowResult | None] = [None] * len(rows)
        states = [_RowState(row, self.eos_token_ids, self.max_new_tokens(row), self.tokenizer) for row in rows]

        def finish(i: int, reason: dict[str, Any]) -> None:
            results[i] = states[i].result(reason)
            if on_finish is not None:
                on_finish(i, results[i])

        active = []
        for i, row in enumerate(rows):
            if row.abort_event.is_set():
                finish(i, {"type": "abort", "message": row.abort_message})
            elif states[i].max_new == 0:
                finish(i, {"type": "length", "length": 0})
            else:
                active.append(i)
        if active:
            self.stats.record_batch(len(active))
            start = time.perf_counter()
            with torch.inference_mode():
                self._decode(states, active, finish, before_step)
            self.stats.busy_seconds += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: DynamicCache) -> torch.Tensor:
        with self.step_lock:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.stats.forward_calls += 1
        return out.logits[:, -1]

    def _mask_early_stops(self, logits_BV: torch.Tensor, states: list[_RowState]) -> None:
        """Stop tokens cannot be sampled before min_new_tokens (SGLang's min-new-tokens penalizer)."""
        for b, state in enumerate(states):
            if state.stop_ids and len(state.output_ids) < state.params.min_new_tokens:
                logits_BV[b, state.stop_ids] = float("-inf")

    def _decode(self, states: list[_RowState], active: list[int], finish: Callable[[int, dict], None],
                before_step: Callable[[], None] | None) -> None:
        input_ids, mask, positions = left_pad([states[i].row.prompt_ids for i in active],
                                              self.pad_token_id, self.device)
        generators = [self._row_generator(states[i].params) for i in active]
        sampling = SamplingBatch.build([states[i].params for i in active], generators, self.device)
        cache = DynamicCache(config=self.model.config)
        while True:
            if before_step is not None:
                before_step()
            keep = [b for b, i in enumerate(active) if not self._finish_if_aborted(states[i], i, finish)]
            if not keep:
                return
            if len(keep) < len(active):
                active, input_ids, mask, positions, sampling = self._select(
                    keep, active, input_ids, mask, positions, sampling, cache)
            logits_BV = self._forward(input_ids, mask, positions, cache)
            self._mask_early_stops(logits_BV, [states[i] for i in active])
            tokens_B, logprobs_B = sample_next_tokens(logits_BV, sampling, self.shared_generator)
            self.stats.generated_tokens += len(active)
            keep = []
            for b, (i, token, logprob) in enumerate(zip(active, tokens_B.tolist(), logprobs_B.tolist())):
                reason = states[i].append(token, logprob)
                if reason is None:
                    keep.append(b)
                else:
                    finish(i, reason)
            if not keep:
                return
            next_ids = tokens_B[:, None]
            if len(keep) < len(active):
                active, next_ids, mask, positions, sampling = self._select(
                    keep, active, next_ids, mask, positions, sampling, cache)
            input_ids = next_ids
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            positions = positions[:, -1:] + 1

    @staticmethod
    def _finish_if_aborted(state: _RowState, i: int, finish: Callable[[int, dict], None]) -> bool:
        if not state.row.abort_event.is_set():
            return False
        finish(i, {"type": "abort", "message": state.row.abort_message})
        return True

    @staticmethod
    def _select(keep: list[int], active: list[int], input_ids: torch.Tensor, mask: torch.Tensor,
                positions: torch.Tensor, sampling: SamplingBatch, cache: DynamicCache):
        """Drop finished rows from every per-row structure, the KV cache included."""
        index = torch.tensor(keep, dtype=torch.long, device=mask.device)
        if cache.get_seq_length() > 0:
            cache.batch_select_indices(index)
        return ([active[b] for b in keep], input_ids[index], mask[index], positions[index],
                sampling.select(keep))

    def _row_generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.sampling_seed is None or params.is_greedy:
            return None
        return torch.Generator(device=self.device).manual_seed(params.sampling_seed)
