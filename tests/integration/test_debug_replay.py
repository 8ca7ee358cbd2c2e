"""Debug modes: a saved rollout replays into training bit for bit (no engines started), the
per-step details and training batches are dumped. The rollout replayed is the session's reference
run's. (The rollout-only mode runs with test_genrm_and_eval.py's eval-config run.)"""

from __future__ import annotations

import json

import pytest
from run_helpers import reference_args, step_rows
from run_helpers import run_relax as run

pytestmark = pytest.mark.integration


def test_saved_rollout_replays_into_training_bit_for_bit(reference_run, tiny_setup, tmp_path):
    data = str(reference_run / "rollouts" / "step_{rollout_id}.pt")
    run(reference_args(tiny_setup, tmp_path / "replay", num_rollout=2) + ["--load-debug-rollout-data", data])
    live, replay = step_rows(reference_run / "run")[:2], step_rows(tmp_path / "replay")
    assert len(replay) == 2
    assert "compute/generate_seconds" in replay[0] and replay[0]["compute/generate_seconds"] == 0.0  # no engines
    for a, b in zip(live, replay):
        for key in ("rollout/reward_mean", "train/pg_loss", "train/grad_norm", "train/entropy", "train/ppo_kl"):
            assert a[key] == b[key], (a["step"], key, a[key], b[key])


def test_details_and_training_batches_are_dumped_per_step(reference_run):
    details = [json.loads(line) for line in open(reference_run / "details" / "rollout" / "1.jsonl")]
    assert len(details) == 16 and {"prompt", "response", "reward", "status"} <= set(details[0])
    import torch

    train = torch.load(reference_run / "train_1.pt", weights_only=False)
    assert train["rollout_id"] == 1 and len(train["advantages"]) == 16 and len(train["old_log_probs"]) == 16
    assert (reference_run / "details" / "train" / "1.pt").exists()

