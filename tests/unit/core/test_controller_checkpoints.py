"""When the Controller checkpoints (`relax.core.controller.checkpoint_due`): every --save-interval
steps and at the end; with --rotate-ckpt every step (pruning keeps the latest and the interval
ones: tests/unit/utils/test_checkpoints.py)."""

from __future__ import annotations

from relax.config.schema import RelaxConfig
from relax.core.controller import checkpoint_due


def saved(cfg: RelaxConfig, steps: int = 6) -> list[int]:
    return [s for s in range(steps) if checkpoint_due(cfg, s, s == steps - 1)]


def test_interval_checkpoints_and_the_last_step():
    assert saved(RelaxConfig().replace(save="/x", save_interval=4)) == [3, 5]
    assert saved(RelaxConfig().replace(save_interval=4)) == []  # no --save: nothing


def test_rotate_ckpt_saves_every_step():
    assert saved(RelaxConfig().replace(save="/x", save_interval=4, rotate_ckpt=True)) == [0, 1, 2, 3, 4, 5]
