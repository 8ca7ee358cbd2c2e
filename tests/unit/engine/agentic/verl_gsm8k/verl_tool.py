"""The "before" of the migration: a gsm8k answer-checking tool in verl's `BaseTool` shape (verl's
verl/tools/gsm8k_tool.py pattern: a stateless service keyed by instance id, a tool reward per call).
Written here without verl; only its interface matters to the port."""

from __future__ import annotations

import json
import re
from uuid import uuid4

TOOL_SCHEMA = {"type": "function", "function": {
    "name": "calc_gsm8k_reward", "description": "A tool for calculating the reward of gsm8k",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string", "description": "The answer"}},
                   "required": ["answer"]}}}


def compute_score(solution: str, ground_truth: str) -> float:
    found = re.findall(r"-?\d+", solution.replace(",", ""))
    return 1.0 if found and found[-1] == str(ground_truth) else 0.0


class Gsm8kTool:
    def __init__(self, config: dict, tool_schema: dict) -> None:
        self.config, self.tool_schema = config, tool_schema
        self._instance_dict: dict[str, dict] = {}

    async def create(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid4())
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    async def execute(self, instance_id: str, parameters: str, **kwargs) -> tuple[str, float, dict]:
        try:
            answer = str(json.loads(parameters).get("answer", ""))
        except (json.JSONDecodeError, AttributeError):
            answer = ""
        self._instance_dict[instance_id]["response"] = "#### " + answer
        reward = await self.calc_reward(instance_id)
        tool_reward = 0.0 if reward > self._instance_dict[instance_id]["reward"] else -0.05  # no improvement
        self._instance_dict[instance_id]["reward"] = reward
        return f"Current parsed answer={answer!r} reward={reward}", tool_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instance_dict[instance_id]
        return compute_score(state["response"], state["ground_truth"])

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instance_dict[instance_id]
