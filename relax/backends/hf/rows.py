"""One decode row of the `hf` engine: what goes in (`DecodeRow`), its state while it runs
(`RowState`: outputs so far and the finish checks), what comes out (`RowResult`), and the
decoder's counters (`DecodeStats`).

A row finishes on the first of: an EOS or `stop_token_ids` token, a `stop` string in the text of
its last tokens, a `stop_regex` match in the text of its last `REGEX_WINDOW` tokens (these three
only from `min_new_tokens` output tokens on), its length (`max_new_tokens`, cut to the context
length). Its result's text drops a matched stop token or string unless `no_stop_trim`; its
output ids and log-probs keep every sampled token. A constrained row (`DecodeRow.grammar`) also
ends when its grammar takes an EOS token (finish_reason stop, matched = that token).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from relax.backends.hf.grammar import RowGrammar
from relax.backends.hf.routing import record_of
from relax.backends.hf.sampling import SamplingParams

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
    grammar: RowGrammar | None = None  # the row's constraint matcher (grammar.py); None: unconstrained
    # Called from the decode thread with (token, logprob) as each token is drawn (streaming).
    on_token: Callable[[int, float], None] | None = None


@dataclass
class RowResult:
    """What one row produced. `finish_reason` has SGLang's shape: {"type": "stop"|"length"|"abort", ...}."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: dict[str, Any]
    text: str
    input_logprobs: list[float | None] | None = None  # per prompt token (None at position 0), when asked
    # --enable-return-routed-experts: the top-k expert ids of every position the row ran through the
    # model, [prompt + output - 1, layers, top_k] (routing.py); None when nothing ran
    routed_experts: Any = None
    # The weights' version the row ended on, stamped as it ends (`Scheduler`), before a push that
    # aborted it can take a new one while its reply waits for the event loop; None: not stamped
    weight_version: str | None = None


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


class RowState:
    """Outputs so far and the finish checks of one row."""

    def __init__(self, row: DecodeRow, eos_ids: frozenset[int], max_new: int, tokenizer: Any):
        self.row, self.params, self.tokenizer = row, row.params, tokenizer
        self.eos_ids = frozenset() if row.params.ignore_eos else eos_ids
        self.max_new = max_new
        self.stop_ids = sorted(self.eos_ids | set(row.params.stop_token_ids))
        self.stop_window = max((len(s) for s in row.params.stop), default=0) + 2
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.routing: list[Any] = []  # routed-expert chunks, one per forward the row was in (routing.py)

    def append(self, token: int, logprob: float) -> dict[str, Any] | None:
        """Record one token; return the finish reason if the row is done."""
        self.output_ids.append(token)
        self.logprobs.append(logprob)
        if self.row.on_token is not None:
            self.row.on_token(token, logprob)
        grammar = self.row.grammar
        if grammar is not None:
            grammar.accept(token)
            if grammar.terminated:  # the grammar took an EOS: done, whatever ignore_eos says (as SGLang)
                return {"type": "stop", "matched": token}
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
        return RowResult(list(self.output_ids), list(self.logprobs), finish_reason, text,
                         routed_experts=record_of(self.routing))
