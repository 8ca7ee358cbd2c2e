"""The tiny DeepEyes environment: a `zoom` tool that returns a region of the prompt's image.

A model turn with a `<tool_call>` for zoom gets that region at full resolution as a "tool"
observation holding an image (`multi_modal_data`; the rollout adds it to the sample's media and
its encoder tensors). A turn without a tool call is the final answer and ends the episode.
Named by examples/deepeyes/deepeyes_config.yaml (`rollout_interaction_env_path`).
"""

from __future__ import annotations

from typing import Any

from examples.deepeyes.base_env import BaseInteractionEnv
from examples.deepeyes.task import REGIONS, from_data_uri, zoom
from relax.engine.agentic.tool_calls import parse_call


class ZoomEnv(BaseInteractionEnv):
    def __init__(self, image: Any) -> None:
        self.image = from_data_uri(image) if isinstance(image, str) else image

    def reset(self):
        return {"obs_str": "", "role": "user"}, {}

    def step(self, response_text: str):
        call = parse_call(response_text)
        if call is None:
            return None, True, {"tool_call": False}
        region = (call.get("arguments") or {}).get("region") if call.get("name") == "zoom" else None
        if region not in REGIONS:
            usage = "error: call zoom with {\"region\": " + " | ".join(f'"{r}"' for r in REGIONS) + "}"
            return {"obs_str": usage, "role": "tool"}, False, {"tool_call": True}
        return {"obs_str": "<image>", "role": "tool", "multi_modal_data": {"image": [zoom(self.image, region)]}}, \
            False, {"tool_call": True, "region": region}


def build_env(sample=None, args=None, **_) -> ZoomEnv:
    return ZoomEnv(sample.multimodal_inputs["image"][0])
