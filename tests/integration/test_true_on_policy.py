"""--true-on-policy-mode end to end (colocate, fsdp + hf): the engines' rollout log-probs equal the
trainer's recomputed old log-probs bitwise, so the mismatch metric is exactly 0 and the first PPO
ratio is exactly 1 — on every step, since colocate engines always hold the trainer's weights.
The run is the colocate Ctrl-C run of the process-cleanup test (interrupted after two steps)."""

from __future__ import annotations

import pytest
from run_helpers import step_rows

pytestmark = pytest.mark.integration


def test_true_on_policy_mismatch_is_exactly_zero(interrupted_run):
    rows = step_rows(interrupted_run.exp_dir)
    assert len(rows) >= 2
    first = rows[0]
    assert first["train/train_rollout_logprob_abs_diff_max"] == 0.0
    assert first["train/train_rollout_importance_ratio_min"] == first["train/train_rollout_importance_ratio_max"] == 1.0
    assert first["train/pg_clipfrac"] == 0.0 and first["train/ppo_kl"] == 0.0
    # After a weight push the engines hold the trainer's weights bitwise: still exact.
    assert rows[1]["train/train_rollout_logprob_abs_diff_max"] == 0.0
    assert all(r["train/grad_norm"] > 0 for r in rows[:2])
