"""Environments for the agentic tests; `sample.metadata["mode"]` picks what each one does.

modes: "tool" (a tool observation after every turn, step reward 0.5), "done_after" (done at step
`metadata["k"]`), "raise_step", "raise_reset", "hang_step" (a synchronous step blocked until
`RELEASE` is set), "bad_obs" (step returns an int), "image" (the observation is a crop of the
prompt's image), "bump" (step calls `HOOKS["bump"]()`: a weight push landing between turns)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from relax.engine.agentic import BaseInteractionEnv

CLOSED: list[int] = []  # sample index of every closed environment
STEPS: dict[int, list[str]] = {}  # sample index -> the texts its steps saw
RELEASE = threading.Event()
HOOKS: dict[str, Any] = {}
EVALUATION: list[bool] = []  # what build_async_env was told


class ScriptedEnv(BaseInteractionEnv):
    def __init__(self, sample: Any) -> None:
        self.index, self.mode = sample.index, sample.metadata.get("mode", "tool")
        self.k = int(sample.metadata.get("k", 1))
        self.image = (sample.multimodal_inputs or {}).get("image", [None])[0]
        self.turn = 0

    def reset(self):
        if self.mode == "raise_reset":
            raise RuntimeError("reset broke")
        return {"obs_str": "ready", "role": "user"}, {"mode": self.mode}

    def step(self, response_text: str):
        self.turn += 1
        STEPS.setdefault(self.index, []).append(response_text)
        if self.mode == "raise_step":
            raise ValueError("the tool crashed")
        if self.mode == "hang_step":
            RELEASE.wait()
        if self.mode == "bad_obs":
            return 42, False, {}
        if self.mode == "bump":
            HOOKS["bump"]()
        if self.mode == "image":
            return self._crop(), False, {"tool_call": True}
        done = self.mode == "done_after" and self.turn >= self.k
        return {"obs_str": f"result {self.turn}", "role": "tool"}, done, {"reward": 0.5, "tool_call": not done}

    def _crop(self) -> dict[str, Any]:
        from PIL import Image

        image = self.image if not isinstance(self.image, str) else _decode(self.image)
        crop = image.crop((0, 0, image.width // 2, image.height // 2)).resize((56, 56), Image.BICUBIC)
        return {"obs_str": "<image>zoomed", "role": "tool", "multi_modal_data": {"image": [crop]}}

    def close(self) -> None:
        CLOSED.append(self.index)


def _decode(uri: str) -> Any:
    import base64
    import io

    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")


def build_env(sample: Any = None, args: Any = None, **_: Any) -> ScriptedEnv:
    return ScriptedEnv(sample)


class AsyncEnv(BaseInteractionEnv):
    """Every method async; "hang_step" waits forever (the timeout path of a coroutine)."""

    def __init__(self, sample: Any) -> None:
        self.index, self.mode, self.turn = sample.index, sample.metadata.get("mode", "tool"), 0

    async def reset(self):
        await asyncio.sleep(0)
        return {"obs_str": "", "role": "user"}, {}

    async def step(self, response_text: str):
        self.turn += 1
        if self.mode == "hang_step":
            await asyncio.Event().wait()
        return {"obs_str": f"async {self.turn}", "role": "tool"}, self.turn >= 2, {"reward": 1.0}

    async def close(self) -> None:
        CLOSED.append(self.index)


def build_async_env(sample: Any = None, args: Any = None, evaluation: bool = False) -> AsyncEnv:
    EVALUATION.append(evaluation)
    return AsyncEnv(sample)


def build_broken_env(sample: Any = None, args: Any = None) -> Any:
    raise OSError("no sandbox available")
