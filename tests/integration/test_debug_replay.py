"""Debug modes: a saved rollout replays into training bit for bit (no engines started), and a
rollout-only run generates without training."""

from __future__ import annotations

import json

import pytest
from run_helpers import run_relax as run
from run_helpers import step_rows as steps

pytestmark = pytest.mark.integration


def common(root):
    return ["--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
            "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6", "--num-rollout", "2", "--lr", "1e-2",
            "--progress-bar", "false", "--resource", '{"actor": [1, 1], "rollout": [1, 1]}']


def test_saved_rollout_replays_into_training_bit_for_bit(ray_cluster, tiny_setup, tmp_path):
    data = str(tmp_path / "rollouts" / "step_{rollout_id}.pt")
    run(common(tiny_setup) + ["--exp-dir", str(tmp_path / "live"), "--save-debug-rollout-data", data,
                              "--dump-details", str(tmp_path / "details"),
                              "--save-debug-train-data", str(tmp_path / "train_{rollout_id}.pt")])
    run(common(tiny_setup) + ["--exp-dir", str(tmp_path / "replay"), "--load-debug-rollout-data", data])
    live, replay = steps(tmp_path / "live"), steps(tmp_path / "replay")
    details = [json.loads(line) for line in open(tmp_path / "details" / "rollout" / "1.jsonl")]
    assert len(details) == 16 and {"prompt", "response", "reward", "status"} <= set(details[0])
    import torch

    train = torch.load(tmp_path / "train_1.pt", weights_only=False)
    assert len(train["advantages"]) == 16 and train["rollout_id"] == 1
    assert (tmp_path / "details" / "train" / "1.pt").exists()
    assert "compute/generate_seconds" in replay[0] and replay[0]["compute/generate_seconds"] == 0.0  # no engines
    for a, b in zip(live, replay):
        for key in ("rollout/reward_mean", "train/pg_loss", "train/grad_norm", "train/entropy", "train/ppo_kl"):
            assert a[key] == b[key], (a["step"], key, a[key], b[key])


def test_rollout_only_generates_without_training(ray_cluster, tiny_setup, tmp_path):
    run(common(tiny_setup) + ["--exp-dir", str(tmp_path), "--debug-rollout-only"])
    rows = steps(tmp_path)
    assert len(rows) == 2 and all("rollout/reward_mean" in r and "train/pg_loss" not in r for r in rows)
    assert [r["rollout/weight_version_min"] for r in rows] == [0.0, 0.0]  # engines kept their weights
