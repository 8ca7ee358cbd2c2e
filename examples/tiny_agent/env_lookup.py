"""The tiny_agent environment: a `lookup` tool over the row's own price list.

A model turn with a `<tool_call>` (Qwen's format: a JSON object with "name" and "arguments")
gets the tool's answer as a "tool" observation; a turn without one is the final answer and ends
the episode (the math reward judges its \\boxed{}). A malformed call gets an error observation.
`parse_call` is relax's (relax/engine/agentic/tool_calls.py).
`--rollout-interaction-env-path examples.tiny_agent.env_lookup`.
"""

from __future__ import annotations

from relax.engine.agentic import BaseInteractionEnv
from relax.engine.agentic.tool_calls import parse_call

__all__ = ["LookupEnv", "build_env", "parse_call"]


class LookupEnv(BaseInteractionEnv):
    def __init__(self, prices: dict[str, str]) -> None:
        self.prices = prices

    def reset(self):
        return {"obs_str": "", "role": "user"}, {}

    def step(self, response_text: str):
        call = parse_call(response_text)
        if call is None:
            return None, True, {"tool_call": False}
        item = str((call.get("arguments") or {}).get("item", "")) if call.get("name") == "lookup" else None
        if item is None:
            result = "error: call lookup with {\"item\": <name>}"
        else:
            result = f"{item}: {self.prices[item]}" if item in self.prices else f"{item}: unknown item"
        return {"obs_str": result, "role": "tool"}, False, {"tool_call": True}


def build_env(sample=None, args=None, **_) -> LookupEnv:
    return LookupEnv(dict(sample.metadata["prices"]))
