"""The routing of one full forward of an HF MoE model: what an engine's recorded routing is compared with."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from relax.utils.routing import RoutingShape
from relax.utils.routing_replay import RouterTap


def full_forward_routing(model_dir: str, shape: RoutingShape) -> Callable[[list[int]], np.ndarray]:
    """tokens -> the routing of one full forward over them, [len - 1, layers, top_k] (expert sets sorted)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tap = RouterTap(model, shape)

    def routing(tokens: list[int]) -> np.ndarray:
        tap.arm(record=True)
        with torch.no_grad():
            model(torch.tensor([tokens]))
        return np.sort(tap.take().numpy()[:-1], -1)
    return routing
