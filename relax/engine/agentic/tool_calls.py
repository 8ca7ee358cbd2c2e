"""Tool calls in a model turn's text, in the chat template's tool-call format.

Qwen's (Hermes') format, which Qwen2.5 / Qwen3 templates render and the tiny examples train on:

    <tool_call>
    {"name": "lookup", "arguments": {"item": "plum"}}
    </tool_call>

A turn may hold several calls, each in its own tags. `parse_tool_calls` returns them in order,
a malformed one (not JSON, no name, arguments not an object) kept with its `error` so the
environment can tell the model; `arguments` given as a JSON string (OpenAI style) is decoded.
Only closed tags count: a turn cut inside a call has no call.

`tool_call_tag(tools)` is the constraint that makes a policy's calls parse (`--multi-turn-constrain-
tool-calls`): SGLang's `structural_tag` sampling param, under which a turn is free text and every
`<tool_call>` the policy starts continues as `\n{"name": <a tool>, "arguments": <its parameters
schema>}\n</tool_call>` (engine-side grammar: the hf engine's llguidance, or SGLang's xgrammar).
Without tools (none in the sample's metadata) a call is any name with an arguments object.
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


TRIGGER = "<tool_call>"
ANY_CALL = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1},
                                             "arguments": {"type": "object"}}, "required": ["name", "arguments"]}


def tool_call_tag(tools: list[dict[str, Any]] | None) -> str:
    """SGLang's `structural_tag` (JSON text) for Qwen's tool calls to `tools` (OpenAI's form:
    `{"type": "function", "function": {"name", "parameters"}}`); module doc."""
    structures = []
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f'a tool is {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}, '
                             f"got {str(tool)[:200]}")
        begin = f'{TRIGGER}\n{{"name": {json.dumps(function["name"])}, "arguments": '
        structures.append({"begin": begin, "schema": function.get("parameters") or {"type": "object"},
                           "end": "}\n</tool_call>"})
    if not structures:
        structures.append({"begin": TRIGGER + "\n", "schema": ANY_CALL, "end": "\n</tool_call>"})
    return json.dumps({"type": "structural_tag", "structures": structures, "triggers": [TRIGGER]})
