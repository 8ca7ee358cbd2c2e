"""Replaying saved rollouts (`relax.engine.rollout.replay`): --load-debug-rollout-data feeds a
step's saved groups back, and --load-debug-rollout-data-subsample keeps a seeded fraction of them."""

from __future__ import annotations

import asyncio

from relax.config.schema import RelaxConfig
from relax.engine.rollout.replay import replay_rollout, save_rollout
from relax.types import Sample


def saved_run(tmp_path, groups: int = 10) -> str:
    template = str(tmp_path / "rollout_{rollout_id}.pt")
    save_rollout(template, 0, [[Sample(prompt=f"p{g}", response=f"r{g}.{j}", group_index=g) for j in range(2)]
                               for g in range(groups)])
    return template


def replayed(cfg: RelaxConfig) -> list[int]:
    groups = asyncio.run(replay_rollout(cfg.args, 0, data_source=None))
    assert all(len(g) == 2 for g in groups)  # whole groups are kept or dropped
    return [g[0].group_index for g in groups]


def test_load_debug_rollout_data_subsample_keeps_the_seeded_fraction_of_groups(tmp_path):
    cfg = RelaxConfig().replace(load_debug_rollout_data=saved_run(tmp_path), rollout_seed=1)
    assert replayed(cfg) == list(range(10))  # unset: every group
    kept = replayed(cfg.replace(load_debug_rollout_data_subsample=0.3))
    assert len(kept) == 3 and kept == sorted(kept) and set(kept) < set(range(10))
    assert replayed(cfg.replace(load_debug_rollout_data_subsample=0.3)) == kept  # seeded: the same groups
    assert replayed(cfg.replace(load_debug_rollout_data_subsample=1.0)) == list(range(10))
