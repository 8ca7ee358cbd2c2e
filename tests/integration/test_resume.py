"""Checkpoint resume: a run saved at step k and resumed with --load continues exactly where the
uninterrupted run would be — same data position, same weights, same optimizer state, same RNG —
so their per-step rewards and losses match."""

from __future__ import annotations

import pytest
from run_helpers import run_relax as run
from run_helpers import step_rows

pytestmark = pytest.mark.integration


def step_metrics(exp_dir):
    return {r["step"]: r for r in step_rows(exp_dir)}


def test_resume_equals_uninterrupted(ray_cluster, tiny_setup, tmp_path):
    root = tiny_setup
    common = ["--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
              "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
              "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--rollout-shuffle",
              "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
              "--lr", "1e-2", "--progress-bar", "false", "--resource", '{"actor": [1, 1], "rollout": [1, 1]}']
    full, first, second = tmp_path / "full", tmp_path / "first", tmp_path / "second"
    run(common + ["--num-rollout", "4", "--exp-dir", str(full)])
    run(common + ["--num-rollout", "2", "--exp-dir", str(first), "--save", str(tmp_path / "ckpt"),
                  "--save-interval", "2"])
    run(common + ["--num-rollout", "4", "--exp-dir", str(second), "--load", str(tmp_path / "ckpt")])

    resumed, uninterrupted = step_metrics(second), step_metrics(full)
    assert sorted(resumed) == [2, 3]  # started after the saved step
    for step in (2, 3):
        for key in ("rollout/reward_mean", "rollout/response_len_mean", "train/pg_loss", "train/grad_norm"):
            assert resumed[step][key] == pytest.approx(uninterrupted[step][key], rel=1e-4, abs=1e-6), (step, key)
