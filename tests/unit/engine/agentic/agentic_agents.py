"""Black-box agents for the gateway tests, written with the plain `openai` client as a user would;
`sample.metadata["mode"]` picks what `scripted` does (`with_tools`: offer the `lookup` tool):

    tools       three calls; after each the returned message (the client's object) and a tool result
    tools_dump  the same, the returned message sent back as `message.model_dump(exclude_none=True)`
    rewrite     two calls that extend each other, then a third on a rewritten history (a new segment)
    raise       one call, then an exception
    hang        one call, then waits forever (the episode's time limit ends it)
    none        returns without calling the model
"""

from __future__ import annotations

import asyncio
from typing import Any

from openai import AsyncOpenAI

TOOL_RESULT = "plum: 7"
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "The price of an item.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}}]


async def scripted(base_url: str, api_key: str, sample: Any, **kwargs: Any) -> dict[str, Any]:
    mode = sample.metadata.get("mode", "tools")
    messages: list[Any] = list(sample.prompt)
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        tools = {"tools": TOOLS} if sample.metadata.get("with_tools") else {}  # the schema is long for a tiny context

        async def ask() -> Any:
            response = await client.chat.completions.create(model="policy", messages=messages, **tools)
            return response.choices[0].message

        if mode == "none":
            return {"calls": 0}
        for turn in range(3 if mode in ("tools", "tools_dump", "rewrite") else 1):
            if mode == "rewrite" and turn == 2:  # the history summarised: a new segment
                messages = [{"role": "system", "content": "summary: plum"}, *sample.prompt]
            message = await ask()
            messages.append(message.model_dump(exclude_none=True) if mode == "tools_dump" else message)
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": TOOL_RESULT})
        if mode == "raise":
            raise RuntimeError("agent broke")
        if mode == "hang":
            await asyncio.Event().wait()
    return {"calls": 3, "evaluation": kwargs.get("evaluation")}


def not_async(base_url, api_key, sample, **kwargs):  # a wrong plugin: not a coroutine function
    return None
