"""A Relax checkpoint directory on disk without training: what the step-selection checks and loaders read."""

from __future__ import annotations

import json


def checkpoint_dir(root, *steps: int) -> str:
    """`root` holding complete (one-rank, fsdp) training parts of `steps` (iter_XXXXXXX/ each); returns it."""
    for step in steps:
        part = root / f"iter_{step:07d}"
        (part / "model").mkdir(parents=True)
        (part / "model" / ".metadata").write_text("m")
        (part / "rng_rank0.pt").write_text("rng")
        (part / "meta.json").write_text(json.dumps({"rollout_id": step, "world_size": 1}))
    return str(root)
