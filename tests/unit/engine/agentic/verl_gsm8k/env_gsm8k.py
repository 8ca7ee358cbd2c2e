"""The verl gsm8k tool as a Relax environment (the migration guide's "Migrate tool environment").

verl's BaseTool is a service keyed by instance id; here one environment per sample holds one
instance: create at reset, execute per tool call in step (its tool reward becomes the step's
`info["reward"]`), release at close. Tool calls are parsed from the response text in Qwen's
`<tool_call>{"name": ..., "arguments": ...}</tool_call>` format; a turn without one ends the episode.
"""

from __future__ import annotations

import json
import re

from verl_gsm8k.base_env import BaseInteractionEnv
from verl_gsm8k.verl_tool import TOOL_SCHEMA, Gsm8kTool

TOOL = Gsm8kTool(config={"type": "native"}, tool_schema=TOOL_SCHEMA)  # verl registers one per tool
CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


class Gsm8kEnv(BaseInteractionEnv):
    def __init__(self, *, max_turns: int, ground_truth: str | None) -> None:
        self.max_turns, self.ground_truth = max_turns, ground_truth
        self.instance_id: str | None = None
        self.turn = 0

    async def reset(self):
        self.turn = 0
        self.instance_id = await TOOL.create(ground_truth=self.ground_truth)
        return {"obs_str": "", "role": "user"}, {}

    async def step(self, response_text: str):
        self.turn += 1
        found = CALL.search(response_text)
        if found is None:
            return None, True, {"tool_call": False}
        try:
            call = json.loads(found.group(1))
        except json.JSONDecodeError:
            return {"obs_str": "invalid tool call: not JSON", "role": "tool"}, False, {"tool_call": True}
        result, tool_reward, metrics = await TOOL.execute(self.instance_id, json.dumps(call.get("arguments", {})))
        done = self.turn >= self.max_turns
        return {"obs_str": result, "role": "tool"}, done, {"reward": tool_reward, "tool_call": True, **metrics}

    async def close(self) -> None:
        if self.instance_id is not None:
            await TOOL.release(self.instance_id)
            self.instance_id = None


def build_env(sample=None, args=None, **_) -> Gsm8kEnv:
    """Factory function, required by Relax rollout."""
    max_turns = args.max_turns if args else 5
    return Gsm8kEnv(max_turns=max_turns, ground_truth=sample.label if sample is not None else None)
