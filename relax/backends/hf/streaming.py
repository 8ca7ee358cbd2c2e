"""Streamed replies of the `hf` engine: server-sent events for `/generate` (SGLang's) and for the
OpenAI routes, built from `HFEngine.stream` (one event per drawn token, then each item's result).

`/generate` with `"stream": true`, as SGLang's server streams it: one `data: <json>\\n\\n` event per
token of each item, each the reply so far: `text`, `output_ids` and `meta_info` (`id`,
`finish_reason` null until the item's last event, `prompt_tokens`, `completion_tokens`,
`cached_tokens`, `weight_version`, and with `return_logprob` the `output_token_logprobs` so far);
the last event of an item is its whole non-streamed reply (`finish_reason`, `e2e_latency`). A
batch (several prompts, or `n` > 1) interleaves its items' events, each with `"index"`: the item's
place in the reply list. Then `data: [DONE]\\n\\n`. `text` and `output_ids` are cumulative (SGLang's
default; its frontend reads `text[pos:]`); with the server's `--incremental-streaming-output` each
event carries only what is new (SGLang's flag of the same name).

Text shown before an item ends holds back what its end may still remove (`visible_text`): an
incomplete UTF-8 character, the last token when the request has `stop_token_ids`, and the last
`len(longest stop string) - 1` characters when it has `stop` strings. So the concatenated deltas
equal the final text and a streamed request's result equals the same request unstreamed (same seed,
same tokens: a seeded row's draws depend on its seed alone, sampling.py).
"""

from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

from relax.backends.hf.protocol import GenerateItem, build_output
from relax.backends.hf.rows import RowResult
from relax.backends.hf.sampling import SamplingParams

DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    """One server-sent event holding `payload` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def visible_text(tokenizer: Any, ids: list[int], params: SamplingParams) -> str:
    """The text of an unfinished row that its finish cannot take back (module doc)."""
    if params.stop_token_ids and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
    text = text.rstrip("\ufffd")  # an incomplete UTF-8 character: its next bytes are still to come
    hold = max((len(s) for s in params.stop), default=1) - 1
    return text[:len(text) - hold] if hold else text


class Progress:
    """One item's tokens so far and the text already sent (for deltas)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.sent_text = ""
        self.sent_ids = 0

    def add(self, token: int, logprob: float) -> None:
        self.ids.append(token)
        self.logprobs.append(logprob)

    def delta(self, text: str) -> str:
        """What `text` adds to the text sent so far (the rest of the final text at the end)."""
        new = text[len(self.sent_text):] if text.startswith(self.sent_text) else ""
        self.sent_text = text if text.startswith(self.sent_text) else self.sent_text
        return new


async def generate_events(engine: Any, items: list[GenerateItem], prepared: tuple, *, batched: bool,
                          incremental: bool, text_in_logprobs: bool) -> AsyncIterator[bytes]:
    """The `/generate` event stream (module doc) of prepared items (`HFEngine.prepare`)."""
    start = time.perf_counter()
    progress = [Progress() for _ in items]
    tokenizer = engine.tokenizer if text_in_logprobs else None
    try:
        async for i, token, value in engine.stream(items, *prepared):
            item, state = items[i], progress[i]
            if token >= 0:
                state.add(token, value)
                chunk = _progress_chunk(engine, item, state, incremental, tokenizer)
            else:
                chunk = build_output(item, value, weight_version=value.weight_version or engine.weight_version,
                                     e2e_latency=time.perf_counter() - start, tokenizer=tokenizer)
                if incremental:
                    chunk["text"] = state.delta(chunk["text"])
                    chunk["output_ids"] = chunk["output_ids"][state.sent_ids:]
            if batched:
                chunk["index"] = i
            yield sse(chunk)
    except RuntimeError as exc:  # a decode failure after the stream began: SGLang's error event
        yield sse({"error": {"message": str(exc), "code": 500}})
    yield DONE


def _progress_chunk(engine: Any, item: GenerateItem, state: Progress, incremental: bool,
                    tokenizer: Any) -> dict[str, Any]:
    text = visible_text(engine.tokenizer, state.ids, item.params)
    meta: dict[str, Any] = {"id": item.rid, "finish_reason": None, "prompt_tokens": len(item.input_ids),
                            "completion_tokens": len(state.ids), "cached_tokens": 0,
                            "weight_version": engine.weight_version}
    if item.return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, tokenizer.decode([tok]) if tokenizer is not None else None]
                                         for lp, tok in zip(state.logprobs, state.ids)]
    if incremental:
        ids, state.sent_ids = state.ids[state.sent_ids:], len(state.ids)
        return {"text": state.delta(text), "output_ids": ids, "meta_info": meta}
    return {"text": text, "output_ids": list(state.ids), "meta_info": meta}


async def text_deltas(engine: Any, items: list[GenerateItem], prepared: tuple
                      ) -> AsyncIterator[tuple[int, str, RowResult | None]]:
    """For the OpenAI routes: `(i, new text, None)` as item i's visible text grows, then
    `(i, the rest of its final text, result)` when it ends."""
    progress = [Progress() for _ in items]
    async for i, token, value in engine.stream(items, *prepared):
        state = progress[i]
        if token >= 0:
            state.add(token, value)
            delta = state.delta(visible_text(engine.tokenizer, state.ids, items[i].params))
            if delta:
                yield i, delta, None
        else:
            yield i, state.delta(value.text), value
