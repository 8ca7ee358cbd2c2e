"""Every advantage estimator trains through the real graph from its flag alone: finite losses, a
non-zero gradient, and a first-pass PPO ratio of exactly 1 on every step. GRPO, the default, is
the session's reference run; each other estimator trains on that run's first rollout,
replayed (--load-debug-rollout-data: no engines), so only the estimator differs."""

from __future__ import annotations

import math

import pytest
from run_helpers import read_metrics, reference_args, run_relax

pytestmark = pytest.mark.integration

ESTIMATORS = ["gspo", "sapo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def check_trained(steps: list[dict]) -> None:
    assert all(math.isfinite(r["train/pg_loss"]) and math.isfinite(r["train/grad_norm"]) for r in steps)
    assert any(r["train/grad_norm"] > 0 for r in steps)
    assert all(r["train/ppo_kl"] == pytest.approx(0.0, abs=1e-5) for r in steps)


def test_grpo_trains_from_its_default(reference_run):
    steps = [r for r in read_metrics(reference_run / "run") if "train/pg_loss" in r]
    assert len(steps) == 4
    check_trained(steps)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_estimator_trains_from_its_flag(reference_run, tiny_setup, tmp_path, estimator):
    run_relax(reference_args(tiny_setup, tmp_path, num_rollout=1, reference=False) + [
        "--advantage-estimator", estimator,
        "--load-debug-rollout-data", str(reference_run / "rollouts" / "step_{rollout_id}.pt")])
    steps = [r for r in read_metrics(tmp_path) if "train/pg_loss" in r]
    assert len(steps) == 1
    check_trained(steps)
