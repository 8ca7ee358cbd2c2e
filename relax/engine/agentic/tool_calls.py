"""Tool calls in a model turn's text, in the chat template's tool-call format.

Qwen's (Hermes') format, which Qwen2.5 / Qwen3 templates render and the tiny examples train on:

    <tool_call>
    {"name": "lookup", "arguments": {"item": "plum"}}
    </tool_call>

A turn may hold several calls, each in its own tags. `parse_tool_calls` returns them in order,
a malformed one (not JSON, no name, arguments not an object) kept with its `error` so the
environment can tell the model; `arguments` given as a JSON string (OpenAI style) is decoded.
Only closed tags count: a turn cut inside a call has no call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the call cannot be made (malformed); None for a well-formed call


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>` of `text`, in order (module doc)."""
    return [_one(body) for body in CALL.findall(text)]


def _one(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the tool call is not JSON ({exc.msg})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return ToolCall("", error='a tool call is {"name": <tool name>, "arguments": {...}}')
    arguments = call.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return ToolCall(call["name"], error=f"the arguments are not JSON ({exc.msg})")
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], error="the arguments must be a JSON object")
    return ToolCall(call["name"], arguments)


def parse_call(text: str) -> dict[str, Any] | None:
    """The first tool call in `text` as the decoded JSON {"name", "arguments"}, {} when it is not a
    JSON object, None when there is none (the examples' environments use this form)."""
    found = CALL.search(text)
    if found is None:
        return None
    try:
        call = json.loads(found.group(1))
    except json.JSONDecodeError:
        return {}
    return call if isinstance(call, dict) else {}
