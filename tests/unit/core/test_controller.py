"""The Controller's step count (`relax.core.controller.num_rollout_steps`): --num-rollout, or
--num-epoch passes over the prompt data."""

from __future__ import annotations

from relax.config.schema import RelaxConfig
from relax.core.controller import num_rollout_steps


def test_num_epoch_sets_the_rollout_steps_from_the_prompt_count():
    cfg = RelaxConfig().replace(num_rollout=None, rollout_batch_size=4)
    assert num_rollout_steps(cfg.replace(num_epoch=1), num_prompts=10) == 3  # 10 prompts in steps of 4: 4, 4, 2
    assert num_rollout_steps(cfg.replace(num_epoch=2), num_prompts=10) == 5  # 20 prompts
    assert num_rollout_steps(cfg.replace(num_epoch=3), num_prompts=8) == 6


def test_num_rollout_wins_over_num_epoch():
    cfg = RelaxConfig().replace(num_rollout=7, num_epoch=2, rollout_batch_size=4)
    assert num_rollout_steps(cfg, num_prompts=10) == 7
