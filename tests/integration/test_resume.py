"""Checkpoint resume: a run resumed with --load from the checkpoint of step k continues exactly
where the uninterrupted run went on — same data position, same weights, same optimizer state,
same RNG — so their per-step rewards and losses match. The uninterrupted run is the session's
reference run (checkpoints at steps 1 and 3); the resumed run starts from the step-1 one, its
step-3 checkpoint made incomplete."""

from __future__ import annotations

import shutil

import pytest
from run_helpers import reference_args, step_rows
from run_helpers import run_relax as run

from relax.config import ConfigError, parse_config
from relax.config.preflight import check_inputs

pytestmark = pytest.mark.integration


def step_metrics(exp_dir):
    return {r["step"]: r for r in step_rows(exp_dir)}


def test_resume_equals_uninterrupted(reference_run, tiny_setup, tmp_path):
    """The reference run's checkpoints (steps 1 and 3) with step 3's damaged, as a crash mid-save
    would leave it: refused before Ray starts, naming the missing file; with --load-fallback the
    run resumes from step 1 and continues exactly as the uninterrupted run did."""
    load = tmp_path / "ckpt"
    shutil.copytree(reference_run / "ckpt", load)
    (load / "iter_0000003" / "rng_rank0.pt").unlink()
    args = reference_args(tiny_setup, tmp_path / "resumed") + ["--load", str(load)]
    with pytest.raises(ConfigError, match=r"step 3\) is incomplete, missing: .*iter_0000003/rng_rank0.pt"):
        check_inputs(parse_config(args))
    run(args + ["--load-fallback"])
    resumed, uninterrupted = step_metrics(tmp_path / "resumed"), step_metrics(reference_run / "run")
    assert sorted(resumed) == [2, 3]  # started after the complete checkpoint's step
    for step in (2, 3):
        for key in ("rollout/reward_mean", "rollout/response_len_mean", "train/pg_loss", "train/grad_norm"):
            assert resumed[step][key] == pytest.approx(uninterrupted[step][key], rel=1e-4, abs=1e-6), (step, key)
