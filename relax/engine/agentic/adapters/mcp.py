"""The tools of an MCP server as a `BaseInteractionEnv`: one connection per episode, through the
`mcp` SDK's `ClientSession` over stdio (a server process the episode starts) or streamable HTTP.

    reset()      connect, initialize, list the tools          -> ({"obs_str": "", "role": "user"}, {"tools": [...]})
    step(text)   the turn's tool calls (tool_calls.py: Qwen's `<tool_call>{"name", "arguments"}</tool_call>`),
                 each run with `session.call_tool`, in order  -> ({"obs_str": results, "role": "tool",
                                                                    "multi_modal_data": {"image": [...]}}, False, info)
                 no tool call in the turn: the final answer    -> (None, True, {"tool_call": False})
    close()      close the session and its transport (the server process ends with it)

What is the model's doing and what is the server's: a malformed call, an unknown tool, arguments
the server rejects (its `isError` result, or a JSON-RPC invalid-params / method-not-found error)
come back to the model as the call's result text, and the episode goes on. A connection that
closes (the server died, the HTTP endpoint went away) raises: the rollout ends that sample with
`env_error` and the run goes on. Image (and audio) content becomes `multi_modal_data` items
(`data:` URIs) at `<image>` placeholders in the text; other content is summarised as text.

Why a task of its own holds the connection: the SDK's transports and session are anyio task
groups, which must be left by the task that entered them, while the rollout runs `reset`, `step`
and `close` as separate tasks (env.py's `call_env`). The holder task enters them (an
`AsyncExitStack`), waits until `close`, and leaves them; `step` awaits its call or the holder's
end, whichever comes first, so a transport that fails makes the step fail instead of hang.

`tools_for_template()` (after `reset`) gives the tools as OpenAI-style function specs, what the
rows' `tools` column (`--tool-key`) holds for the chat template; `list_tool_specs(...)` fetches
them once, for data preparation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TextIO

from relax.engine.agentic.env import BaseInteractionEnv, Observation
from relax.engine.agentic.tool_calls import ToolCall, parse_tool_calls
from relax.utils.data.formatting import MULTIMODAL_PLACEHOLDERS

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
except ImportError as exc:  # the `agents` extra
    raise ImportError("relax.engine.agentic.adapters.mcp needs the MCP SDK: pip install 'relax-rl[agents]' "
                      "(or pip install 'mcp>=2')") from exc

logger = logging.getLogger(__name__)

# JSON-RPC errors that answer the call itself (the model's bad call), not a broken connection.
CALL_ERRORS = {-32602: "invalid params", -32601: "method not found"}
MEDIA = ("image", "audio")  # MCP content types that become multi_modal_data items (the same kind names)
Transport = Callable[[], Any]  # () -> an async context manager yielding (read_stream, write_stream, ...)


class MCPToolEnv(BaseInteractionEnv):
    """An MCP server's tools for one episode (module doc). Exactly one of:

    command: the stdio server to start, `[program, *args]` (`env`, `cwd` for its process);
    url: a streamable-HTTP endpoint (`http://127.0.0.1:8000/mcp`);
    transport: `() -> async context manager` yielding the SDK's stream pair (auth headers, SSE...).
    """

    def __init__(self, *, command: Sequence[str] | None = None, url: str | None = None,
                 transport: Transport | None = None, env: dict[str, str] | None = None, cwd: str | None = None,
                 role: str = "tool", max_calls_per_turn: int = 8, errlog: TextIO | None = None) -> None:
        if sum(x is not None for x in (command, url, transport)) != 1:
            raise ValueError("MCPToolEnv takes exactly one of command=[program, *args] (a stdio server), "
                             "url='http://host:port/mcp' (streamable HTTP) or transport=")
        if command is not None and (isinstance(command, str) or not command):
            raise ValueError(f"MCPToolEnv(command=...) is a list [program, *args], got {command!r}")
        self.transport = transport or (stdio_transport(command, env=env, cwd=cwd, errlog=errlog) if command
                                       else http_transport(url))
        self.role, self.max_calls_per_turn = role, max_calls_per_turn
        self.tools: dict[str, dict[str, Any]] = {}  # name -> the tool as the server lists it (wire names)
        self._connection: _Connection | None = None

    async def reset(self) -> tuple[Observation, dict[str, Any]]:
        await self.close()
        self._connection = await _Connection.open(self.transport)
        self.tools = {tool["name"]: tool for tool in self._connection.tools}
        return {"obs_str": "", "role": "user"}, {"tools": sorted(self.tools)}

    async def step(self, response_text: str) -> tuple[Observation | None, bool, dict[str, Any]]:
        calls = parse_tool_calls(response_text)
        if not calls:
            return None, True, {"tool_call": False}
        if self._connection is None:
            raise RuntimeError("MCPToolEnv.step before reset (the rollout calls reset first)")
        results = [await self._call(call) for call in calls[:self.max_calls_per_turn]]
        if len(calls) > self.max_calls_per_turn:
            results.append(_text(f"error: at most {self.max_calls_per_turn} tool calls per turn; the other "
                                 f"{len(calls) - self.max_calls_per_turn} were not run", error=True))
        observation: Observation = {"obs_str": "\n".join(r.text for r in results), "role": self.role}
        media = {kind: [item for r in results for item in r.media.get(kind, [])] for kind in MEDIA}
        if any(media.values()):
            observation["multi_modal_data"] = {kind: items for kind, items in media.items() if items}
        info = {"tool_call": len(calls), "tools": [c.name for c in calls], "tool_errors": sum(r.error for r in results)}
        return observation, False, info

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    def tools_for_template(self) -> list[dict[str, Any]]:
        """The server's tools as OpenAI-style function specs (after `reset`)."""
        if self._connection is None and not self.tools:
            raise RuntimeError("MCPToolEnv.tools_for_template needs the tool list: call reset() first, or use "
                               "list_tool_specs(...)")
        return [function_spec(tool) for tool in self.tools.values()]

    async def _call(self, call: ToolCall) -> _Result:
        if call.error is not None:
            return _text(f"error: {call.error}", error=True)
        if call.name not in self.tools:
            return _text(f"error: unknown tool {call.name!r}; the tools are {', '.join(sorted(self.tools))}",
                         error=True)
        assert self._connection is not None
        try:
            result = await self._connection.call(call.name, call.arguments)
        except Exception as exc:  # noqa: BLE001 - the server's answer to a bad call is the model's to read
            code = getattr(getattr(exc, "error", None), "code", None)
            if code not in CALL_ERRORS:
                raise
            return _text(f"error: {call.name}: {exc}", error=True)
        return _content(result)


@dataclass
class _Result:
    text: str
    media: dict[str, list[str]]
    error: bool


def _text(text: str, *, error: bool = False) -> _Result:
    return _Result(text, {}, error)


def _content(result: dict[str, Any]) -> _Result:
    """A `CallToolResult` (its wire form) as text with media placeholders and media items."""
    pieces: list[str] = []
    media: dict[str, list[str]] = {}
    for item in result.get("content") or []:
        kind = item.get("type")
        if kind in MEDIA and item.get("data"):
            media.setdefault(kind, []).append(f"data:{item.get('mimeType', '')};base64,{item['data']}")
            pieces.append(MULTIMODAL_PLACEHOLDERS[kind])
        elif item.get("type") == "text":
            pieces.append(item.get("text", ""))
        elif item.get("type") == "resource" and "text" in (item.get("resource") or {}):
            pieces.append(item["resource"]["text"])
        else:
            pieces.append(f"[{item.get('type', 'unknown')} content: {item.get('uri') or item.get('name') or ''}]")
    if not pieces and result.get("structuredContent") is not None:
        pieces.append(json.dumps(result["structuredContent"]))
    error = bool(result.get("isError"))
    text = "\n".join(pieces) or ("error" if error else "")
    return _Result(text, media, error)


def function_spec(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool (wire form) as an OpenAI-style function spec."""
    return {"type": "function", "function": {
        "name": tool["name"], "description": tool.get("description") or "",
        "parameters": tool.get("inputSchema") or {"type": "object", "properties": {}}}}


async def list_tool_specs(**server: Any) -> list[dict[str, Any]]:
    """The server's tools as function specs (`server`: `MCPToolEnv`'s keywords), for data rows."""
    env = MCPToolEnv(**server)
    try:
        await env.reset()
        return env.tools_for_template()
    finally:
        await env.close()


def stdio_transport(command: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                    errlog: TextIO | None = None) -> Transport:
    """Start `command` as the episode's server and talk to it over its stdin/stdout."""
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=env, cwd=cwd)
    return lambda: stdio_client(params, errlog=errlog or _stderr())


def _stderr() -> TextIO:
    """Where the server's stderr goes: ours, or the process's own when ours is no file (a notebook,
    a captured stream), which a subprocess cannot write to."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return sys.__stderr__


def http_transport(url: str) -> Transport:
    """A streamable-HTTP MCP endpoint."""
    return lambda: streamable_http_client(url)


@dataclass(eq=False)
class _Connection:
    """A session held open by its own task (module doc: why)."""

    session: Any
    tools: list[dict[str, Any]]
    holder: asyncio.Task
    stop: asyncio.Event

    @classmethod
    async def open(cls, transport: Transport) -> _Connection:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        holder = asyncio.create_task(_hold(transport, ready, stop))
        try:
            session, tools = await _first(ready, holder)
        except BaseException:  # failed, or cancelled (--env-timeout): the holder leaves what it entered
            holder.cancel()
            await _settle(holder)
            raise
        return cls(session, tools, holder, stop)

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await _first(self.session.call_tool(name, arguments), self.holder)
        return result.model_dump(by_alias=True, exclude_none=True)

    async def close(self) -> None:
        self.stop.set()
        await _settle(self.holder)


async def _hold(transport: Transport, ready: asyncio.Future, stop: asyncio.Event) -> None:
    """Enter the transport and the session, hand them over through `ready`, wait for `stop`, leave."""
    try:
        async with AsyncExitStack() as stack:
            streams = await stack.enter_async_context(transport())
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await session.initialize()
            listing = await session.list_tools()
            ready.set_result((session, [t.model_dump(by_alias=True, exclude_none=True) for t in listing.tools]))
            await stop.wait()
    except BaseException as exc:
        if not ready.done():
            ready.set_exception(ConnectionError(f"could not connect to the MCP server: {_reason(exc)}"))
        raise


async def _first(awaitable: Any, holder: asyncio.Task) -> Any:
    """`awaitable`'s result, or ConnectionError when the holder task ends first (the connection closed)."""
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait({task, holder}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ConnectionError(f"the MCP server connection closed: {_ended(holder)}")


async def _settle(holder: asyncio.Task) -> None:
    """Wait for the holder task to leave the session; what ended it is logged, not raised (the step
    that met a dead connection has already failed)."""
    await asyncio.wait({holder})
    why = _ended(holder)
    if why != "closed":
        logger.debug("MCP connection ended: %s", why)


def _ended(holder: asyncio.Task) -> str:
    if not holder.done():
        return "still open"
    if holder.cancelled():
        return "cancelled"
    exc = holder.exception()
    return "closed" if exc is None else _reason(exc)


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # anyio task groups wrap errors
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
