"""Every advantage estimator trains through the real graph from its flag alone: two steps on the
tiny model, finite losses, a non-zero gradient, and a first-step PPO ratio of exactly 1."""

from __future__ import annotations

import math

import pytest
from run_helpers import read_metrics, run_relax

pytestmark = pytest.mark.integration

ESTIMATORS = ["grpo", "gspo", "sapo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_estimator_trains_from_its_flag(ray_cluster, tiny_setup, tmp_path, estimator):
    root = tiny_setup
    run_relax([
        "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--advantage-estimator", estimator,
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
        "--num-rollout", "2", "--lr", "1e-2", "--progress-bar", "false", "--exp-dir", str(tmp_path),
        "--resource", '{"actor": [1, 1], "rollout": [1, 1]}',
    ])
    rows = read_metrics(tmp_path)
    steps = [r for r in rows if "train/pg_loss" in r]
    assert len(steps) == 2
    assert all(math.isfinite(r["train/pg_loss"]) and math.isfinite(r["train/grad_norm"]) for r in steps)
    assert any(r["train/grad_norm"] > 0 for r in steps)
    assert all(r["train/ppo_kl"] == pytest.approx(0.0, abs=1e-5) for r in steps)
