"""Every advantage estimator trains through the real graph from its flag alone: finite losses, a
non-zero gradient, and (one on-policy pass) a PPO ratio of exactly 1 on every step
(run_helpers.check_trained). GRPO, the default, is the session's reference run. The others ride
on runs the suite makes anyway (a run costs ~15 s of start-up here, the estimator nothing):
gspo the VL run and sapo the VL megatron run (test_multimodal_run), reinforce_plus_plus the
plugin run (conftest), reinforce_plus_plus_baseline the partial-rollout run (fully async, in
the Advantages role: test_partial_rollout); PPO with its critic has runs of its own
(test_ppo_critic, test_fully_async)."""

from __future__ import annotations

import pytest
from run_helpers import check_trained, read_metrics

pytestmark = pytest.mark.integration


def test_grpo_trains_from_its_default(reference_run):
    steps = [r for r in read_metrics(reference_run / "run") if "train/pg_loss" in r]
    assert len(steps) == 4
    check_trained(steps)
