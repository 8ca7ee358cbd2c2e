"""Debug modes and a resumed run, on one run: the session's reference run's checkpoints (steps 1
and 3) with step 3's damaged, as a crash mid-save would leave it, loaded with --load-fallback (the
run resumes from step 1) and its saved rollouts replayed with --load-debug-rollout-data (no engines
started): steps 2 and 3 train on exactly the reference run's samples, from exactly its weights and
optimizer state, so their training numbers equal its bit for bit. The per-step details and training
batches are dumped. (Resuming with generation, same data position and sampling, is checked by
test_recovery.py's tier-2 restart; the rollout-only mode runs with test_genrm_and_eval.py's
eval-config run.)"""

from __future__ import annotations

import json
import shutil

import pytest
from run_helpers import reference_args, step_rows
from run_helpers import run_relax as run

from relax.config import ConfigError, parse_config
from relax.config.preflight import check_inputs

pytestmark = pytest.mark.integration


def test_a_resumed_run_replays_the_saved_rollouts_into_training_bit_for_bit(reference_run, tiny_setup, tmp_path):
    load = tmp_path / "ckpt"
    shutil.copytree(reference_run / "ckpt", load)
    (load / "iter_0000003" / "rng_rank0.pt").unlink()
    data = str(reference_run / "rollouts" / "step_{rollout_id}.pt")
    # With the reference run's Reference role, though its KL weighs 0 in the loss: without the role the
    # replayed train/entropy differed from the reference run's at the 8th digit.
    args = reference_args(tiny_setup, tmp_path / "replay") + [
        "--load", str(load), "--load-debug-rollout-data", data]
    with pytest.raises(ConfigError, match=r"step 3\) is incomplete, missing: .*iter_0000003/rng_rank0.pt"):
        check_inputs(parse_config(args))  # refused before Ray starts, naming the missing file
    run(args + ["--load-fallback"])
    live = {r["step"]: r for r in step_rows(reference_run / "run")}
    replay = step_rows(tmp_path / "replay")
    assert [r["step"] for r in replay] == [2, 3]  # started after the complete checkpoint's step
    assert all(r["compute/generate_seconds"] == 0.0 for r in replay)  # no engines
    for row in replay:
        for key in ("rollout/reward_mean", "train/pg_loss", "train/grad_norm", "train/entropy", "train/ppo_kl"):
            assert row[key] == live[row["step"]][key], (row["step"], key, row[key], live[row["step"]][key])


def test_details_and_training_batches_are_dumped_per_step(reference_run):
    details = [json.loads(line) for line in open(reference_run / "details" / "rollout" / "1.jsonl")]
    assert len(details) == 16 and {"prompt", "response", "reward", "status"} <= set(details[0])
    import torch

    train = torch.load(reference_run / "train_1.pt", weights_only=False)
    assert train["rollout_id"] == 1 and len(train["advantages"]) == 16 and len(train["old_log_probs"]) == 16
    assert (reference_run / "details" / "train" / "1.pt").exists()
