"""The tiny_agent task as a black-box agent: plain `openai` client code, nothing of Relax imported.

    --agent-function-path examples.tiny_agent.blackbox_agent.run_episode

Relax calls `run_episode` once per sample with the base URL and key of that sample's gateway
session (docs/agents.md); the agent talks to the policy as to any OpenAI-compatible server. Its
loop: ask the model with the `lookup` function tool; while the reply calls it, run the lookup on
this row's own price list (`sample.metadata["prices"]`), append the assistant message as returned
and the tool's answer, and ask again; a reply without a tool call is the final answer (the run's
math reward judges its \\boxed{}). At most `MAX_CALLS` calls, as the built-in rollout's
`--max-turns 3`. The gateway records every call's token ids, log-probs and weight version; the
agent never sees them. The episodes share one SSL context (`_SSL`), each with its own HTTP client.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx
from openai import AsyncOpenAI

from examples.tiny_agent.task import TOOLS

MAX_CALLS = 3
# Built once: an HTTP client loads the CA bundle into a new SSL context otherwise (~25 ms of CPU), and
# one client shared by all episodes scans its whole connection pool on every request.
_SSL = ssl.create_default_context()


def lookup(prices: dict[str, str], arguments: str) -> str:
    """The tool: an item's price, as examples/tiny_agent/env_lookup.py answers it."""
    try:
        item = str(json.loads(arguments).get("item", ""))
    except (json.JSONDecodeError, AttributeError):
        return 'error: call lookup with {"item": <name>}'
    return f"{item}: {prices[item]}" if item in prices else f"{item}: unknown item"


async def run_episode(base_url: str, api_key: str, sample: Any, **kwargs: Any) -> int:
    """One episode; returns the number of tool calls made (kept in the sample's metadata)."""
    prices = sample.metadata["prices"]
    messages: list[Any] = list(sample.prompt)  # the row's system + user messages
    calls = 0
    http = httpx.AsyncClient(verify=_SSL, timeout=httpx.Timeout(300.0))
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http) as client:
        for _ in range(MAX_CALLS):
            response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            message = response.choices[0].message
            messages.append(message)  # as returned: the gateway continues from its own tokens
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                calls += 1
                result = lookup(prices, call.function.arguments) if call.function.name == "lookup" else \
                    f"error: no tool {call.function.name!r}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return calls
