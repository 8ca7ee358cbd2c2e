"""One short GRPO run checks two hooks around the training batch: the
--custom-convert-samples-to-train-data-path plugin builds the rows the actor trains on, and
--ref-update-interval hands the actor's weights to the reference every N steps (the KL to the
reference is 0 right after a refresh and positive in between)."""

from __future__ import annotations

import pytest
import torch
from run_helpers import run_relax, step_rows

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run_dir(ray_cluster, tiny_setup, tmp_path_factory):
    root, exp = tiny_setup, tmp_path_factory.mktemp("train_data_ref")
    run_relax([
        "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.integration.digit_reward.reward_func",
        "--custom-convert-samples-to-train-data-path", "tests.integration.train_data_plugins.mask_first_token",
        "--use-kl-loss", "--kl-loss-coef", "0", "--kl-loss-type", "low_var_kl", "--ref-update-interval", "2",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
        "--num-rollout", "3", "--lr", "2e-2", "--progress-bar", "false", "--exp-dir", str(exp),
        "--save-debug-train-data", str(exp / "train_{rollout_id}.pt"),
        "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}',
    ])
    return exp


def test_convert_samples_plugin_builds_the_training_rows(run_dir):
    assert (run_dir / "convert_calls.txt").read_text().split() == ["16", "16", "16"]
    for step in range(3):
        batch = torch.load(run_dir / f"train_{step}.pt", weights_only=False)
        assert all(mask[0] == 0 and sum(mask) == len(mask) - 1 for mask in batch["loss_masks"])


def test_reference_takes_the_actor_weights_every_interval(run_dir):
    steps = step_rows(run_dir)
    kl = [r["train/kl_loss"] for r in steps]
    assert kl[0] == pytest.approx(0.0, abs=1e-5)  # reference and actor start from one checkpoint
    assert kl[1] > 1e-4  # the actor trained at step 0; the reference did not follow yet
    assert kl[2] == pytest.approx(0.0, abs=1e-5), kl  # refreshed before step 2
    assert [r.get("reference/updated", 0.0) for r in steps] == [0.0, 0.0, 1.0]
