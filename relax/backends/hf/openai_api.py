"""The OpenAI-compatible routes of the `hf` engine, as SGLang serves them: `/v1/models`,
`/v1/completions` and `/v1/chat/completions` (non-streaming).

Agent code and evaluation harnesses call these instead of `/generate`. A request becomes the
same engine rows as a `/generate` request: OpenAI's sampling fields map onto SGLang's
`sampling_params` (`max_tokens` -> `max_new_tokens`, `seed` -> `sampling_seed`, penalties,
`logit_bias`, `stop`, `n`) and go through the same validation, so a bad value is a 400 naming
the field. Chat messages are rendered with the tokenizer's chat template (with `tools` when
given). Fields that would change what comes back and that this engine does not do (`stream`,
`echo`, `suffix`, `best_of` > 1, log-probs, `response_format`, a forced `tool_choice`) are
refused with a 400 naming them, never silently dropped.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from relax.backends.hf.protocol import GenerateItem, check_prompt, expand_samples
from relax.backends.hf.sampling import parse_sampling_params

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
    logprobs: Any = None
    best_of: int | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    top_logprobs: int | None = None


SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "n": "n", "stop": "stop", "stop_token_ids": "stop_token_ids", "seed": "sampling_seed",
                   "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                   "repetition_penalty": "repetition_penalty", "logit_bias": "logit_bias",
                   "ignore_eos": "ignore_eos", "skip_special_tokens": "skip_special_tokens"}


def _refuse_unsupported(req: _Sampling, extra: dict[str, Any]) -> None:
    refused = {"stream": req.stream, "logprobs": req.logprobs not in (None, False, 0),
               "best_of": req.best_of not in (None, 1), **extra}
    bad = sorted(name for name, on in refused.items() if on)
    if bad:
        raise ValueError(f"{', '.join(bad)}: not supported by the hf engine's OpenAI API (send "
                         f"{' / '.join(bad)} unset or use /generate, or the sglang backend)")


def sampling_params(req: _Sampling, max_tokens: int | None) -> dict[str, Any]:
    """OpenAI fields -> SGLang `sampling_params` (unset fields keep SGLang's defaults)."""
    params = {sglang: getattr(req, field) for field, sglang in SAMPLING_FIELDS.items()
              if getattr(req, field) is not None}
    params["max_new_tokens"] = max_tokens
    return params


def _finish(reason: dict[str, Any]) -> str:
    return {"stop": "stop", "length": "length"}.get(reason.get("type"), reason.get("type", "stop"))


async def _run(engine: Any, prompts: list[list[int]], params: dict[str, Any], prefix: str
               ) -> tuple[str, list, dict[str, int]]:
    """Generate for `prompts`; returns (response id, results in choice order, usage)."""
    parsed = parse_sampling_params(params)
    rid = f"{prefix}-{uuid.uuid4().hex}"
    items = [GenerateItem(f"{rid}_{i}", ids, parsed, False) for i, ids in enumerate(prompts)]
    for i, item in enumerate(items):
        check_prompt(i, item.input_ids, parsed, engine.vocab_size, engine.max_context_len)
    results = await engine.generate(expand_samples(items))
    prompt = sum(len(ids) for ids in prompts)  # each prompt once, however many samples it has
    completion = sum(len(r.output_ids) for r in results)
    return rid, results, {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}


def _prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]


async def completions(engine: Any, req: CompletionRequest) -> dict[str, Any]:
    _refuse_unsupported(req, {"echo": req.echo, "suffix": req.suffix is not None})
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    rid, results, usage = await _run(engine, _prompts(req.prompt, engine.tokenizer),
                                     sampling_params(req, max_tokens), "cmpl")
    return {"id": rid, "object": "text_completion", "created": int(time.time()),
            "model": req.model or engine.served_model_name,
            "choices": [{"index": i, "text": r.text, "logprobs": None, "finish_reason": _finish(r.finish_reason)}
                        for i, r in enumerate(results)],
            "usage": usage}


async def chat_completions(engine: Any, req: ChatRequest) -> dict[str, Any]:
    _refuse_unsupported(req, {"response_format": req.response_format not in (None, {"type": "text"}),
                              "top_logprobs": bool(req.top_logprobs),
                              "tool_choice": req.tool_choice not in (None, "auto", "none")})
    tokenizer = engine.tokenizer
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the model's tokenizer has no chat template: use /v1/completions with a rendered prompt")
    ids = tokenizer.apply_chat_template(req.messages, tools=req.tools, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    rid, results, usage = await _run(engine, [list(ids)], sampling_params(req, max_tokens), "chatcmpl")
    return {"id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": req.model or engine.served_model_name,
            "choices": [{"index": i, "message": {"role": "assistant", "content": r.text},
                         "logprobs": None, "finish_reason": _finish(r.finish_reason)}
                        for i, r in enumerate(results)],
            "usage": usage}


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
