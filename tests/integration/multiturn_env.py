"""The plugin run's environment: after the first model turn a tool observation (" ok "), after
the second the episode is done (tests/integration/multiturn_generate.py runs it)."""

from __future__ import annotations

from relax.engine.agentic import BaseInteractionEnv


class OkEnv(BaseInteractionEnv):
    def __init__(self) -> None:
        self.turn = 0

    def reset(self):
        return {"obs_str": "", "role": "user"}, {}

    def step(self, response_text: str):
        self.turn += 1
        if self.turn >= 2:
            return None, True, {"reward": 0.0}
        return {"obs_str": " ok ", "role": "tool"}, False, {"reward": 0.0, "tool_call": True}


def build_env(sample=None, args=None, **_):
    return OkEnv()
