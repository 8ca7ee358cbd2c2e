"""--true-on-policy-mode end to end (colocate, fsdp + hf): the engines' rollout log-probs equal the
trainer's recomputed old log-probs bitwise, so the mismatch metric is exactly 0 and the first PPO
ratio is exactly 1 — on every step, since colocate engines always hold the trainer's weights."""

from __future__ import annotations

import pytest
from run_helpers import run_relax as run
from run_helpers import step_rows

pytestmark = pytest.mark.integration


def test_true_on_policy_mismatch_is_exactly_zero(ray_cluster, tiny_setup, tmp_path):
    root = tiny_setup
    run(["--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
         "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
         "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--rollout-shuffle",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
         "--rollout-temperature", "0.8", "--num-rollout", "2", "--lr", "1e-2", "--progress-bar", "false",
         "--resource", '{"actor": [1, 1], "rollout": [1, 1]}', "--true-on-policy-mode", "--exp-dir", str(tmp_path)])

    rows = step_rows(tmp_path)
    assert len(rows) == 2
    first = rows[0]
    assert first["train/train_rollout_logprob_abs_diff_max"] == 0.0
    assert first["train/train_rollout_importance_ratio_min"] == first["train/train_rollout_importance_ratio_max"] == 1.0
    assert first["train/pg_clipfrac"] == 0.0 and first["train/ppo_kl"] == 0.0
    # After a weight push the engines hold the trainer's weights bitwise: still exact.
    assert rows[1]["train/train_rollout_logprob_abs_diff_max"] == 0.0
    assert all(r["train/grad_norm"] > 0 for r in rows)
