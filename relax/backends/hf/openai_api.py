"""The OpenAI-compatible routes of the `hf` engine, as SGLang serves them: `/v1/models`,
`/v1/completions` and `/v1/chat/completions`.

Agent code and evaluation harnesses call these instead of `/generate`. A request becomes the
same engine rows as a `/generate` request: OpenAI's sampling fields map onto SGLang's
`sampling_params` (`max_tokens` -> `max_new_tokens`, `seed` -> `sampling_seed`, penalties,
`logit_bias`, `stop`, `n`) and go through the same validation, so a bad value is a 400 naming
the field. Chat messages are rendered with the tokenizer's chat template (with `tools` when
given).

Constraints (openai_constraints.py): `response_format` (`json_object`, `json_schema`,
`structural_tag`), SGLang's extra fields `regex`, `json_schema`, `ebnf`, and on chat a forced
`tool_choice` (`"required"` or a named function: the reply's calls are made to parse, and come
back as `message.tool_calls`). `stream: true` answers with server-sent events (`chat.completion.chunk`
/ `text_completion` chunks, then `[DONE]`); with `stream_options: {"include_usage": true}` a last
chunk has `usage` and no choices. Fields that would change what comes back and that this engine
does not do (`echo`, `suffix`, `best_of` > 1, log-probs) are refused with a 400 naming them, never
silently dropped.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from relax.backends.hf.openai_constraints import constraint_params, forced_tool, tool_calls
from relax.backends.hf.protocol import GenerateItem, check_prompt, expand_samples
from relax.backends.hf.sampling import parse_sampling_params
from relax.backends.hf.streaming import DONE, sse, text_deltas

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and SGLang's) default for /v1/completions


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")  # `user`, `metadata`, ...: no effect on the output

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # (SGLang's extension)
    min_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: Any = None
    best_of: int | None = None
    response_format: dict[str, Any] | None = None
    regex: str | None = None  # (SGLang's extensions: constrained decoding)
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    top_logprobs: int | None = None


SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "n": "n", "stop": "stop", "stop_token_ids": "stop_token_ids", "seed": "sampling_seed",
                   "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                   "repetition_penalty": "repetition_penalty", "logit_bias": "logit_bias",
                   "ignore_eos": "ignore_eos", "skip_special_tokens": "skip_special_tokens"}


def _refuse_unsupported(req: _Sampling, extra: dict[str, Any]) -> None:
    refused = {"logprobs": req.logprobs not in (None, False, 0),
               "best_of": req.best_of not in (None, 1), **extra}
    bad = sorted(name for name, on in refused.items() if on)
    if bad:
        raise ValueError(f"{', '.join(bad)}: not supported by the hf engine's OpenAI API (send "
                         f"{' / '.join(bad)} unset or use /generate, or the sglang backend)")
    if req.stream_options is not None and not req.stream:
        raise ValueError("stream_options is only allowed with stream: true")


def sampling_params(req: _Sampling, max_tokens: int | None) -> dict[str, Any]:
    """OpenAI fields -> SGLang `sampling_params` (unset fields keep SGLang's defaults)."""
    params = {sglang: getattr(req, field) for field, sglang in SAMPLING_FIELDS.items()
              if getattr(req, field) is not None}
    params["max_new_tokens"] = max_tokens
    return params


def _finish(reason: dict[str, Any]) -> str:
    return {"stop": "stop", "length": "length"}.get(reason.get("type"), reason.get("type", "stop"))


@dataclass
class _Call:
    """A request as engine rows (each prompt's n samples, prompt-major), its response id and prompt size."""

    rid: str
    items: list[GenerateItem]
    prompt_tokens: int  # each prompt once, however many samples it has

    def usage(self, results: list) -> dict[str, int]:
        completion = sum(len(r.output_ids) for r in results)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}


def _call(engine: Any, prompts: list[list[int]], params: dict[str, Any], prefix: str) -> _Call:
    parsed = parse_sampling_params(params)
    rid = f"{prefix}-{uuid.uuid4().hex}"
    items = [GenerateItem(f"{rid}_{i}", ids, parsed, False) for i, ids in enumerate(prompts)]
    for i, item in enumerate(items):
        check_prompt(i, item.input_ids, parsed, engine.vocab_size, engine.max_context_len)
    return _Call(rid, expand_samples(items), sum(len(ids) for ids in prompts))


def _prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]


async def completions(engine: Any, req: CompletionRequest) -> Any:
    _refuse_unsupported(req, {"echo": req.echo, "suffix": req.suffix is not None})
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    call = _call(engine, _prompts(req.prompt, engine.tokenizer),
                 {**sampling_params(req, max_tokens), **constraint_params(req)}, "cmpl")
    head = {"id": call.rid, "object": "text_completion", "created": int(time.time()),
            "model": req.model or engine.served_model_name}
    if req.stream:
        return await _stream(engine, req, call, head, lambda i, text, result: {
            "index": i, "text": text, "logprobs": None, "finish_reason": result and _finish(result.finish_reason)})
    results = await engine.generate(call.items)
    choices = [{"index": i, "text": r.text, "logprobs": None, "finish_reason": _finish(r.finish_reason)}
               for i, r in enumerate(results)]
    return {**head, "choices": choices, "usage": call.usage(results)}


def _chat_message(text: str, reason: dict[str, Any], forced: str | None) -> tuple[dict[str, Any], str]:
    """The assistant message of a choice and its finish_reason (a forced tool choice: tool_calls)."""
    calls = tool_calls(forced, text) if forced else None
    if calls:
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": text}, _finish(reason)


async def chat_completions(engine: Any, req: ChatRequest) -> Any:
    _refuse_unsupported(req, {"top_logprobs": bool(req.top_logprobs)})
    forced = forced_tool(req.tool_choice, req.tools)
    tokenizer = engine.tokenizer
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the model's tokenizer has no chat template: use /v1/completions with a rendered prompt")
    ids = tokenizer.apply_chat_template(req.messages, tools=req.tools, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    call = _call(engine, [list(ids)], {**sampling_params(req, max_tokens), **constraint_params(req, forced)},
                 "chatcmpl")
    head = {"id": call.rid, "object": "chat.completion", "created": int(time.time()),
            "model": req.model or engine.served_model_name}
    if req.stream:
        return await _stream(engine, req, call, {**head, "object": "chat.completion.chunk"},
                             lambda i, text, result: _chat_delta(i, text, result, forced))
    results = await engine.generate(call.items)
    choices = []
    for i, r in enumerate(results):
        message, finish = _chat_message(r.text, r.finish_reason, forced)
        choices.append({"index": i, "message": message, "logprobs": None, "finish_reason": finish})
    return {**head, "choices": choices, "usage": call.usage(results)}


def _chat_delta(i: int, text: str, result: Any, forced: str | None) -> dict[str, Any] | None:
    """A chat chunk's choice: the role first, content deltas, then the finish (a forced tool
    choice's calls come whole with it, nothing before)."""
    if result is None:
        return None if forced else {"index": i, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
    if forced:
        message, finish = _chat_message(result.text, result.finish_reason, forced)
        delta = {k: v for k, v in message.items() if k != "role" and v is not None}
        return {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": i, "delta": {"content": text} if text else {}, "logprobs": None,
            "finish_reason": _finish(result.finish_reason)}


async def _stream(engine: Any, req: _Sampling, call: _Call, head: dict[str, Any], choice: Any) -> Any:
    """Server-sent chunks `head + {"choices": [choice(i, text delta, result or None)]}`, the usage
    chunk when asked, `[DONE]`. A bad request is refused (ValueError) before the stream starts."""
    from fastapi.responses import StreamingResponse

    prepared = await engine.prepare(call.items)
    chat = head["object"] == "chat.completion.chunk"

    async def events():
        results = []
        if chat:
            for i in range(len(call.items)):
                yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]})
        try:
            async for i, text, result in text_deltas(engine, call.items, prepared):
                results += [result] if result is not None else []
                payload = choice(i, text, result)
                if payload is not None:
                    yield sse({**head, "choices": [payload]})
        except RuntimeError as exc:
            yield sse({"error": {"message": str(exc), "code": 500}})
        if (req.stream_options or {}).get("include_usage"):
            yield sse({**head, "choices": [], "usage": call.usage(results)})
        yield DONE

    return StreamingResponse(events(), media_type="text/event-stream")


def add_openai_routes(app: FastAPI, engine: Any, error_response: Any) -> None:
    """Mount the routes; `error_response(status, message)` builds the engine's error reply."""
    from relax.backends.hf.engine import EngineUnavailable

    async def answer(call: Any, req: Any) -> Any:
        try:
            return await call(engine, req)
        except ValueError as exc:
            return error_response(400, str(exc))
        except EngineUnavailable as exc:
            return error_response(503, str(exc))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": engine.served_model_name, "object": "model",
                                            "owned_by": "relax", "root": engine.model_path}]}

    @app.post("/v1/completions")
    async def v1_completions(req: CompletionRequest):
        return await answer(completions, req)

    @app.post("/v1/chat/completions")
    async def v1_chat_completions(req: ChatRequest):
        return await answer(chat_completions, req)
