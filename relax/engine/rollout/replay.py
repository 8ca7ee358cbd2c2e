"""Saving rollouts and replaying them into training (`--save-debug-rollout-data`,
`--load-debug-rollout-data`).

A saved rollout is the step's scored groups as `Sample.to_dict()` rows, one file per step
(`{rollout_id}` in the path). Replaying feeds those exact rows back through the data plane,
so training can be debugged without inference engines and reproduces the original run's
training numbers bit for bit on CPU.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import torch

from relax.types import Sample

logger = logging.getLogger(__name__)


def rollout_path(template: str, rollout_id: int) -> str:
    if "{rollout_id}" not in template:
        raise ValueError(f"debug rollout data path {template!r} needs a {{rollout_id}} placeholder, "
                         "e.g. /data/debug/rollout_{rollout_id}.pt")
    return template.format(rollout_id=rollout_id)


def save_rollout(template: str, rollout_id: int, groups: list[list[Sample]]) -> str:
    path = rollout_path(template, rollout_id)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save({"rollout_id": rollout_id, "groups": [[s.to_dict() for s in g] for g in groups]}, path)
    return path


def load_rollout(template: str, rollout_id: int, *, subsample: float | None = None,
                 seed: int = 0) -> list[list[Sample]]:
    """The saved groups of `rollout_id`; `subsample` keeps that fraction of groups (seeded)."""
    path = rollout_path(template, rollout_id)
    if not os.path.exists(path):
        raise FileNotFoundError(f"--load-debug-rollout-data: no saved rollout for step {rollout_id} at {path}")
    data = torch.load(path, weights_only=False)
    groups = [[Sample.from_dict(d) for d in g] for g in data["groups"]]
    if subsample is not None:
        if not 0 < subsample <= 1:
            raise ValueError(f"--load-debug-rollout-data-subsample must be in (0, 1], got {subsample}")
        n_keep = max(1, round(len(groups) * subsample))
        keep = sorted(random.Random(seed + rollout_id).sample(range(len(groups)), n_keep))
        groups = [groups[i] for i in keep]
    return groups


def dump_rollout_details(dump_dir: str, rollout_id: int, groups: list[list[Sample]], rewards: list[float]) -> str:
    """`--dump-details`: one JSON line per sample, for reading what the model did."""
    import json

    path = os.path.join(dump_dir, "rollout", f"{rollout_id}.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    samples = [s for g in groups for s in g]
    with open(path, "w") as f:
        for s, r in zip(samples, rewards):
            f.write(json.dumps({"index": s.index, "group_index": s.group_index, "prompt": s.prompt,
                                "response": s.response, "label": s.label, "reward": r, "raw_reward": s.reward,
                                "status": s.status.value, "response_length": s.response_length,
                                "weight_versions": s.weight_versions}, default=str) + "\n")
    return path


async def replay_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Sample]]:
    """A rollout function that returns the saved groups of this step instead of generating."""
    return load_rollout(args.load_debug_rollout_data, rollout_id, subsample=args.load_debug_rollout_data_subsample,
                        seed=args.rollout_seed)
