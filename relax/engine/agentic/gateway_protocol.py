"""The OpenAI chat-completions protocol of the agent gateway (docs/agents.md): request validation,
the Qwen-style tool-call parser, responses and server-sent-event chunks.

A request body is validated at the boundary: a bad field is a 400 naming it
(`temperature: Input should be greater than or equal to 0`), never an exception deeper in. Fields
that would change what comes back and that the gateway does not do (`n` > 1, `logprobs`, a forced
`tool_choice`, a `response_format`, media parts) are refused by name, never silently dropped;
fields without effect on the output (`model`, `user`, `parallel_tool_calls`, ...) are accepted.

Messages are kept in a canonical form (role, text content, tool calls as name + parsed arguments,
no ids): the form the prefix comparison of gateway_session.py uses, so an assistant message the
agent sends back as the gateway returned it (the `openai` package's object, its arguments a JSON
string, `content` None or "") compares equal to the one the gateway recorded.

Tool calls are parsed from the completion text in Qwen's format (`<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`, one block per call): `content` is the text outside the blocks
(None when empty) and `finish_reason` "tool_calls". A block that is not a JSON object with a
string `name` and object `arguments` leaves the whole text as content (a malformed call is the
model's answer).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relax.engine.agentic import tool_calls

MAX_BODY_BYTES = 1 << 20  # a request body above this is a 413
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                   "repetition_penalty": "repetition_penalty", "stop": "stop", "seed": "sampling_seed"}


class GatewayError(Exception):
    """A request the gateway answers with an error: `status`, the message, the field it names."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Open):
    type: Literal["text"]
    text: str


class Function(_Open):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: Function


class Message(_Open):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDef(_Open):
    name: str


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool = False


class ChatBody(_Open):
    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: Literal[False] | None = None
    response_format: dict[str, Literal["text"]] | None = None


@dataclass(frozen=True)
class ChatCall:
    """One validated request: canonical `messages`, the `tools` as sent (rendered by the chat
    template), whether tool calls are parsed, streaming, the sampling overrides (SGLang names)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    stream: bool
    include_usage: bool
    sampling: dict[str, Any]
    max_tokens: int | None


def parse_chat(raw: Any) -> ChatCall:
    """A request body (parsed JSON) -> `ChatCall`; GatewayError 400 naming the first bad field."""
    if not isinstance(raw, dict):
        raise GatewayError(400, "body: a JSON object with `messages` is expected", "body")
    try:
        body = ChatBody.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"] if not _union_tag(part)) or "body"
        raise GatewayError(400, f"{field}: {err['msg']}{_hint(field)}", field) from None
    sampling = {sglang: getattr(body, name) for name, sglang in SAMPLING_FIELDS.items()
                if getattr(body, name) is not None}
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    tools = raw.get("tools") if body.tools else None
    return ChatCall(messages=[canonical(m) for m in body.messages], tools=tools,
                    parse_tools=bool(tools) and body.tool_choice != "none", stream=body.stream,
                    include_usage=bool(body.stream_options and body.stream_options.include_usage),
                    sampling=sampling, max_tokens=max_tokens)


def _hint(field: str) -> str:
    hints = {"n": " (the gateway answers one choice per call)",
             "tool_choice": " (a forced tool call is not supported)",
             "logprobs": " (the gateway records the log-probs itself; it does not return them)",
             "response_format": " (only {\"type\": \"text\"})"}
    content = " (a string or text parts: the gateway serves a text model)" if field.endswith(".content") else ""
    return hints.get(field.split(".")[0], content)


def _union_tag(part: Any) -> bool:
    """A location part pydantic adds for a union's member (`str`, `list[TextPart]`), not a field."""
    return isinstance(part, str) and (not part.isidentifier() or part in ("str", "int", "float", "bool", "dict"))


def canonical(message: Message) -> dict[str, Any]:
    """The message as the prefix comparison and the chat template see it (module doc)."""
    content = message.content
    if isinstance(content, list):
        content = "".join(part.text for part in content)
    out: dict[str, Any] = {"role": message.role, "content": content or ""}
    if message.tool_calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": c.function.name,
                                                               "arguments": _arguments(c.function.arguments)}}
                             for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(arguments: str | dict[str, Any]) -> Any:
    """A call's arguments as an object (the chat template writes them as JSON); an unparsable
    string stays a string."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool calls) of a completion's text (module doc; the parser is tool_calls.py's)."""
    parsed = tool_calls.parse_tool_calls(text)
    if not parsed or any(call.error is not None for call in parsed):
        return text, []
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
             for call in parsed]
    return tool_calls.CALL.sub("", text).strip() or None, calls


@dataclass(frozen=True)
class Reply:
    """What one call answers: the assistant message's parts, the finish reason, token counts."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    id: str = ""
    created: int = 0

    @classmethod
    def of(cls, text: str, parse_tools: bool, finish: str, prompt_tokens: int, completion_tokens: int,
           model: str) -> Reply:
        content, calls = parse_tool_calls(text) if parse_tools else (text, [])
        reason = "tool_calls" if calls and finish == "stop" else ("length" if finish == "length" else "stop")
        return cls(content=content, tool_calls=calls, finish_reason=reason, prompt_tokens=prompt_tokens,
                   completion_tokens=completion_tokens, model=model, id=f"chatcmpl-{uuid.uuid4().hex}",
                   created=int(time.time()))

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out

    def canonical(self) -> dict[str, Any]:
        """The returned assistant message in canonical form (what the next call should repeat)."""
        return canonical(Message.model_validate(self.message()))

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": self.message(), "logprobs": None,
                             "finish_reason": self.finish_reason}],
                "usage": self.usage()}

    def chunks(self, include_usage: bool) -> list[str]:
        """The reply as OpenAI's stream: the role, the content, each tool call, the finish reason, the
        usage when asked, then `[DONE]`; each an SSE `data:` line."""
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if self.content:
            deltas.append({"content": self.content})
        deltas += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(self.tool_calls)]
        events = [self._chunk(delta, None) for delta in deltas] + [self._chunk({}, self.finish_reason)]
        if include_usage:
            events.append({**self._chunk({}, None), "choices": [], "usage": self.usage()})
        return [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "relax"}]}
