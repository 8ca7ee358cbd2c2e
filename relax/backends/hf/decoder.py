"""Continuous batched decoding with one shared KV cache (the `hf` engine's hot loop).

Two cache layouts share the loop below. Llama-family and dense VL models (`static_cache.static_decode_supported`)
decode on the slot cache of `static_cache.py` (`batch.SlotBatch`: each row owns a slot of a
preallocated cache written in place, steps replayed as CUDA graphs on a GPU; a row that does not
fit the cache waits for a slot). Other models use transformers' `DynamicCache`
(`batch.DynamicBatch`), as described next; the prefill, sampling, finishing and aborting are the same for both.

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
Input-token log-probs (`logprob_start_len`, e.g. a multi-turn rollout scoring a finished
trajectory with `max_new_tokens: 0`) come from the same function under the mode: one unpadded
row, at the request's temperature (1.0 for greedy), so a scored row equals the trainer's bitwise
wherever its response starts (the engine passes each request's temperature along).

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

Constrained rows (`DecodeRow.grammar`: SGLang's `regex` / `json_schema` / `ebnf` / `structural_tag`,
grammar.py) have the tokens their grammar forbids set to -inf in `sample`, after the penalizers and
before the sampler, so they draw from, and report the log-probs of, the constrained distribution;
the grammar consumes each drawn token (rows.py) and the row ends when it takes an EOS. A streamed
request's rows carry `on_token`, called from this thread as each token is drawn (streaming.py).

Joining needs plain `DynamicLayer` cache layers; for models whose cache has other layer kinds
(sliding window, linear attention) `can_join` is False and `admit` is never called: new
requests then wait for the next batch.

MoE routing (`--enable-return-routed-experts`, routing.py): each forward's expert ids are taken
under the step lock and kept per row, the prefill's for every prompt position, a decode step's for
the token each row fed.

Parts: `rows` (a row's input, state, finish checks and result; the stats), `batch` (the running
batch and its KV cache bookkeeping), `prefill` (a group's prefill, text and media); this module
is the decode loop: admitting, aborting, the decode step and sampling.

`BatchDecoder.run` is synchronous and meant to run in a worker thread; it calls
`on_finish(i, result)` the moment row i finishes (i counts rows in admission order: the
initial rows, then each admitted group), so the server can answer it before the rest of the
batch is done. Each forward holds `step_lock`, which weight loading also takes.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from relax.algorithms.logprobs import row_response_log_probs
from relax.backends.hf.batch import DynamicBatch, SlotBatch, cache_supports_join
from relax.backends.hf.grammar import mask_logits
from relax.backends.hf.prefill import prefill
from relax.backends.hf.routing import engine_tap, keep_decode
from relax.backends.hf.rows import DecodeRow, DecodeStats, RowResult, RowState
from relax.backends.hf.sampling import SamplingBatch, apply_penalties, sample_next_tokens
from relax.backends.hf.static_cache import GraphRunner, SlotCache, kv_shape, static_decode_supported
from relax.utils.multimodal.models import rope_positions


def unbanned_logprobs(logprobs_B: torch.Tensor, chosen_logits_B: torch.Tensor, banned_BK: torch.Tensor,
                      temperature_B: torch.Tensor) -> torch.Tensor:
    """Log-probs under the full distribution from those sampled with K tokens masked out.

    Masked: lp' = l_t/T - LSE_u (LSE over the allowed tokens); full: lp = l_t/T - logaddexp(LSE_u,
    LSE_b) = lp' - softplus(LSE_b - LSE_u), with LSE_b over the banned logits / T."""
    lse_u = chosen_logits_B.float() / temperature_B - logprobs_B
    lse_b = torch.logsumexp(banned_BK.float() / temperature_B[:, None], dim=-1)
    return logprobs_B - torch.nn.functional.softplus(lse_b - lse_u)


class BatchDecoder:
    """Decode `DecodeRow`s with a transformers causal LM, with continuous batching (see module doc)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, device: torch.device | str,
                 eos_token_ids: Sequence[int], max_context_len: int, pad_token_id: int = 0,
                 step_lock: threading.Lock | None = None, seed: int | None = None, true_on_policy: bool = False,
                 max_running_requests: int = 256, max_total_tokens: int | None = None, cuda_graphs: bool = True,
                 cuda_graph_max_bs: int | None = None, static_cache: bool = True,
                 banned_token_ids: Sequence[int] = (), routed_experts: bool = False):
        self.model, self.tokenizer = model, tokenizer
        # --enable-return-routed-experts: every forward's expert ids kept per row (routing.py)
        self.routing = engine_tap(model, routed_experts)
        self.last_routing: torch.Tensor | None = None  # the last forward's ids, [B * S, layers, top_k]
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
        # decode through transformers' DynamicCache (`DynamicBatch`).
        why_not = static_decode_supported(model) if static_cache else "turned off"
        if why_not is None and self.routing is not None:  # (MoE models never take the slot cache anyway)
            why_not = "--enable-return-routed-experts records routing on the DynamicCache path"
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
                        media: Sequence[dict[str, torch.Tensor] | None] | None = None,
                        temperatures: Sequence[float] | None = None) -> list[list[float | None]]:
        """Log-prob of every prompt token given the tokens before it (raw logits, no temperature):
        `[None, logp(t1 | t0), logp(t2 | t0 t1), ...]` per prompt. Right-padded forwards without a
        cache, `rows_per_forward` prompts at a time, each under `step_lock`; a prompt with `media`
        goes alone, with its encoder tensors. True on-policy: each prompt scored alone by the
        trainer's function at its request's temperature (`temperatures`, 1.0 for greedy and when
        not given)."""
        if self.true_on_policy:
            n = len(prompts)
            return [self._row_prompt_logprobs(p, m, t) for p, m, t in
                    zip(prompts, media or [None] * n, temperatures or [None] * n)]
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

    def _row_prompt_logprobs(self, prompt: Sequence[int], media: dict[str, torch.Tensor] | None,
                             temperature: float | None) -> list[float | None]:
        tokens = list(prompt)
        temperature = 1.0 if temperature is None else temperature
        if len(tokens) < 2:
            return [None] * len(tokens)
        ids_1L = torch.tensor([tokens], dtype=torch.long, device=self.device)
        with self.step_lock, torch.inference_mode():
            logp_R = row_response_log_probs(self.model, tokens, len(tokens) - 1, temperature, self.device,
                                            self.media_inputs(ids_1L, torch.ones_like(ids_1L), media))
        self.stats.forward_calls += 1
        return [None] + logp_R.tolist()

    def run(self, rows: Sequence[DecodeRow], *, on_finish: Callable[[int, RowResult], None] | None = None,
            before_step: Callable[[], None] | None = None,
            admit: Callable[[int], Sequence[DecodeRow]] | None = None) -> list[RowResult]:
        """Decode `rows`, plus the rows `admit(running)` hands over at each step boundary while
        the batch runs (they join it). Returns every row's result in admission order."""
        states: list[RowState] = []
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
                states.append(RowState(row, self.eos_token_ids, self.max_new_tokens(row), self.tokenizer))
                results.append(None)
                if states[i].max_new == 0 and not row.abort_event.is_set():
                    finish(i, {"type": "length", "length": 0})
                else:
                    todo.append(i)
            return todo

        batch: DynamicBatch | None = None
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
                    group, waiting = prefill(self, waiting, states, finish, running=batch is not None)
                    batch = group if batch is None else (batch if group is None else batch.join(group))
                    prefilled = asked - len(waiting)
                    if prefilled and started:
                        self.stats.record_join(running + prefilled, prefilled)
                    elif prefilled:
                        self.stats.record_batch(prefilled)
                    started = started or bool(prefilled)
            self.stats.busy_seconds += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                cache: DynamicCache, **media: torch.Tensor) -> torch.Tensor:
        """One cached forward under `step_lock`; the last position's logits `[B, V]`."""
        with self.step_lock:
            if self.routing is not None:
                self.routing.arm(record=True)
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1, **media)
            if self.routing is not None:  # taken under the lock: no other thread's forward in between
                self.last_routing = self.routing.take()
                self.routing.arm()  # (a rescoring or input-log-prob forward records nothing)
        self.stats.forward_calls += 1
        return out.logits[:, -1]

    def _decode_step(self, batch: "DynamicBatch | SlotBatch", states: list[RowState],
                     finish: Callable[[int, dict], None]) -> "DynamicBatch | SlotBatch | None":
        """One forward for every running row (each feeds its pending token); sample the next ones."""
        if isinstance(batch, SlotBatch):
            with self.step_lock:
                logits_BV = self.runner.step(batch.slots_B, batch.next_ids_B, batch.write_B, batch.start_B,
                                             max(batch.slots), max(batch.writes), batch.offset_B)
            self.stats.forward_calls += 1
            tokens_B, keep = self.sample(logits_BV, batch.rows, states, batch.sampling, finish)
            batch.next_ids_B, batch.write_B = tokens_B, batch.write_B + 1
            batch.writes = [w + 1 for w in batch.writes]
            return batch.select(keep)
        mask_BT = torch.cat([batch.mask_BT, batch.mask_BT.new_ones((len(batch.rows), 1))], dim=1)
        logits_BV = self.forward(batch.next_ids_B[:, None], mask_BT, batch.next_pos_B[:, None], batch.cache)
        if self.routing is not None:
            keep_decode(states, batch.rows, self.last_routing, self.routing.shape)
        tokens_B, keep = self.sample(logits_BV, batch.rows, states, batch.sampling, finish)
        batch.mask_BT, batch.next_ids_B, batch.next_pos_B = mask_BT, tokens_B, batch.next_pos_B + 1
        return batch.select(keep)

    def sample(self, logits_BV: torch.Tensor, rows: list[int], states: list[RowState], sampling: SamplingBatch,
               finish: Callable[[int, dict], None]) -> tuple[torch.Tensor, list[int]]:
        """Draw one token per row, record it, answer finished rows. Returns (tokens_B, kept positions).
        Constrained rows' forbidden tokens are masked first (grammar.py): they sample, and report the
        log-probs of, the constrained distribution."""
        self._apply_penalizers(logits_BV, [states[i] for i in rows])
        constrained = [b for b, i in enumerate(rows) if states[i].row.grammar is not None]
        if constrained:
            mask_logits(logits_BV, constrained, [states[rows[b]].row.grammar for b in constrained])
        if self.banned_ids is not None:
            banned_BK = logits_BV[:, self.banned_ids].clone()
            logits_BV[:, self.banned_ids] = float("-inf")
        tokens_B, logprobs_B = sample_next_tokens(logits_BV, sampling, self.shared_generator)
        if self.banned_ids is not None:
            chosen_B = logits_BV.gather(-1, tokens_B[:, None])[:, 0]  # greedy rows: temperature_B is 1
            full_B = unbanned_logprobs(logprobs_B, chosen_B, banned_BK, sampling.temperature_B)
            if constrained:  # a constrained row reports its constrained distribution's log-prob
                free_B = torch.ones_like(full_B, dtype=torch.bool)
                free_B[constrained] = False
                full_B = torch.where(free_B, full_B, logprobs_B)
            logprobs_B = full_B
        self.stats.generated_tokens += len(rows)
        keep = []
        for b, (i, token, logprob) in enumerate(zip(rows, tokens_B.tolist(), logprobs_B.tolist())):
            reason = states[i].append(token, logprob)
            if reason is None:
                keep.append(b)
            else:
                finish(i, reason)
        return tokens_B, keep

    def _rescore(self, state: RowState) -> list[float]:
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

    def _apply_penalizers(self, logits_BV: torch.Tensor, states: list[RowState]) -> None:
        """SGLang's penalizers: repetition/frequency/presence penalties and the logit bias, and no
        stop token before min_new_tokens."""
        for b, state in enumerate(states):
            if state.params.has_penalties:
                apply_penalties(logits_BV[b], state.params, state.row.prompt_ids, state.output_ids)
            # (a constrained row's grammar decides when it may end: an EOS ban could leave it no token)
            if state.stop_ids and len(state.output_ids) < state.params.min_new_tokens and state.row.grammar is None:
                logits_BV[b, state.stop_ids] = float("-inf")

    @staticmethod
    def _finish_if_aborted(state: RowState, i: int, finish: Callable[[int, dict], None]) -> bool:
        if not state.row.abort_event.is_set():
            return False
        finish(i, {"type": "abort", "message": state.row.abort_message})
        return True
