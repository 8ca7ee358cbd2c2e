"""Constrained decoding on the `hf` engine's OpenAI routes: OpenAI's fields -> SGLang's constraint
`sampling_params` (grammar.py compiles them), and forced tool calls back into `tool_calls`.

- `response_format`: `{"type": "text"}` (none), `{"type": "json_object"}` (any JSON object),
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`, and SGLang's
  `{"type": "structural_tag", "structures": [...], "triggers": [...]}`.
- SGLang's extra request fields `regex`, `json_schema`, `ebnf`.
- Chat `tool_choice`: `"required"` constrains the reply to a JSON list of
  `{"name": <a tool>, "parameters": <its parameters>}` (at least one), a named function
  (`{"type": "function", "function": {"name": ...}}`) to that function's parameters object, as
  SGLang does; the reply is returned as `message.tool_calls` (finish_reason `tool_calls`).
  `"auto"` and `"none"` leave the text free.
At most one of these per request: two are a 400 naming both.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

ANY_OBJECT = {"type": "object"}


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any]:
    if fmt is None or fmt.get("type") == "text":
        return {}
    kind = fmt.get("type")
    if kind == "json_object":
        return {"json_schema": json.dumps(ANY_OBJECT)}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", ANY_OBJECT), dict):
            raise ValueError('response_format.json_schema must be {"name": ..., "schema": {<JSON schema>}}')
        return {"json_schema": json.dumps(spec.get("schema", ANY_OBJECT))}
    if kind == "structural_tag":
        return {"structural_tag": json.dumps(fmt)}
    raise ValueError(f"response_format.type must be text, json_object, json_schema or structural_tag, got {kind!r}")


def _tools_by_name(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out = {}
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": '
                             '{...}}}}')
        params = function.get("parameters") or ANY_OBJECT
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        out[function["name"]] = params
    return out


def forced_tool(tool_choice: Any, tools: list[dict[str, Any]] | None) -> str | None:
    """The forced tool: its name, "*" for `required`, None when the text stays free."""
    if tool_choice in (None, "auto", "none"):
        return None
    names = _tools_by_name(tools)
    if not names:
        raise ValueError(f"tool_choice {tool_choice!r} needs tools: send the tools it chooses from")
    if tool_choice == "required":
        return "*"
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise ValueError('tool_choice must be "auto", "none", "required" or {"type": "function", "function": '
                         '{"name": ...}}')
    if name not in names:
        raise ValueError(f"tool_choice names function {name!r}, which is not among the tools {sorted(names)}")
    return name


def tool_schema(forced: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The JSON schema a forced tool choice constrains the reply to (module doc)."""
    names = _tools_by_name(tools)
    if forced != "*":
        return names[forced]
    calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
              "required": ["name", "parameters"], "additionalProperties": False} for name, params in names.items()]
    return {"type": "array", "minItems": 1, "items": {"anyOf": calls}}


def constraint_params(req: Any, forced: str | None = None) -> dict[str, Any]:
    """The SGLang constraint `sampling_params` of an OpenAI request (at most one source)."""
    sources = {"response_format": _response_format(getattr(req, "response_format", None)),
               "regex": {"regex": req.regex} if req.regex is not None else {},
               "json_schema": ({"json_schema": req.json_schema if isinstance(req.json_schema, str)
                                else json.dumps(req.json_schema)} if req.json_schema is not None else {}),
               "ebnf": {"ebnf": req.ebnf} if req.ebnf is not None else {},
               "tool_choice": ({"json_schema": json.dumps(tool_schema(forced, req.tools))} if forced else {})}
    given = [name for name, params in sources.items() if params]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} each constrain the reply: send only one of them")
    return sources[given[0]] if given else {}


def tool_calls(forced: str, text: str) -> list[dict[str, Any]] | None:
    """The reply's calls in OpenAI's form; None when the text is not a whole call (cut by its length)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    pairs = [(forced, value)] if forced != "*" else [(c.get("name"), c.get("parameters")) for c in value
                                                     if isinstance(c, dict)]
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "index": k, "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}} for k, (name, args) in enumerate(pairs)]
