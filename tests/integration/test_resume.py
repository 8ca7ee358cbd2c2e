"""Checkpoint resume: a run resumed with --load from the checkpoint of step k continues exactly
where the uninterrupted run went on — same data position, same weights, same optimizer state,
same RNG — so their per-step rewards and losses match. The uninterrupted run is the session's
reference run (checkpoints at steps 1 and 3); the resumed run starts from the step-1 one."""

from __future__ import annotations

import shutil

import pytest
from run_helpers import reference_args, step_rows
from run_helpers import run_relax as run

pytestmark = pytest.mark.integration


def step_metrics(exp_dir):
    return {r["step"]: r for r in step_rows(exp_dir)}


def checkpoint_of_step(ckpt, step: int, out):
    """A checkpoint directory holding only step `step`'s checkpoint (actor and data position)."""
    shutil.copytree(ckpt / f"iter_{step:07d}", out / f"iter_{step:07d}")
    (out / "rollout").mkdir()
    shutil.copy(ckpt / "rollout" / f"global_dataset_state_dict_{step}.pt", out / "rollout")
    (out / "latest_checkpointed_iteration.txt").write_text(str(step))
    return out


def test_resume_equals_uninterrupted(reference_run, tiny_setup, tmp_path):
    load = checkpoint_of_step(reference_run / "ckpt", 1, tmp_path / "ckpt")
    run(reference_args(tiny_setup, tmp_path / "resumed") + ["--load", str(load)])
    resumed, uninterrupted = step_metrics(tmp_path / "resumed"), step_metrics(reference_run / "run")
    assert sorted(resumed) == [2, 3]  # started after the saved step
    for step in (2, 3):
        for key in ("rollout/reward_mean", "rollout/response_len_mean", "train/pg_loss", "train/grad_norm"):
            assert resumed[step][key] == pytest.approx(uninterrupted[step][key], rel=1e-4, abs=1e-6), (step, key)
