"""Fully-async mode on CPU: the real roles (Rollout, Actor, ActorFwd, Reference, Advantages,
the DCS coordinator) as Serve deployments streaming through TransferQueue.

Invariants: with --max-staleness 0 the async pipeline trains on exactly what colocate trains
on (same seed -> same per-step rewards and losses); with --max-staleness 2 rollout really runs
ahead, and no trained row ever lags more than 2 weight versions.
"""

from __future__ import annotations

import pytest
from run_helpers import run_relax as run
from run_helpers import step_rows

pytestmark = pytest.mark.integration


def common(root, n_rollout: int) -> list[str]:
    return ["--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
            "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--rollout-shuffle",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
            "--lr", "1e-2", "--progress-bar", "false", "--num-rollout", str(n_rollout),
            "--use-kl-loss", "--kl-loss-coef", "0.05", "--kl-loss-type", "low_var_kl"]


def by_step(exp_dir) -> dict[int, dict]:
    return {r["step"]: r for r in step_rows(exp_dir)}


def test_staleness_zero_equals_colocate(ray_cluster, tiny_setup, tmp_path):
    """Also with --ref-update-interval 2: the reference takes the actor's weights before step 2
    in both modes (in fully-async mode it waits for the Actor's save), so the KL is 0 there."""
    root = tiny_setup
    refresh = ["--ref-update-interval", "2"]
    run(common(root, 3) + refresh + ["--exp-dir", str(tmp_path / "sync"), "--colocate",
                                     "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}'])
    run(common(root, 3) + refresh + ["--exp-dir", str(tmp_path / "async"), "--fully-async", "--max-staleness", "0",
                                     "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1], '
                                                   '"actor_fwd": [1, 1], "advantages": [1, 0]}'])
    sync, fully_async = by_step(tmp_path / "sync"), by_step(tmp_path / "async")
    assert sorted(sync) == sorted(fully_async) == [0, 1, 2]
    for step in sync:
        assert fully_async[step]["train/max_version_lag"] == 0
        assert fully_async[step]["rollout/reward_mean"] == sync[step]["rollout/reward_mean"], step
        assert fully_async[step]["rollout/response_len_mean"] == sync[step]["rollout/response_len_mean"], step
        for key in ("train/pg_loss", "train/kl_loss", "train/grad_norm"):
            assert fully_async[step][key] == pytest.approx(sync[step][key], rel=1e-4, abs=1e-6), (step, key)
    assert fully_async[1]["train/kl_loss"] > 0 and fully_async[2]["train/kl_loss"] == pytest.approx(0, abs=1e-7)
    # Pushes overlap the next step: step k reports the push that finished during it (version k).
    assert [fully_async[s].get("weight_sync/version") for s in (0, 1, 2)] == [None, 1, 2]
    assert all(fully_async[s]["weight_sync/bytes"] > 0 for s in (1, 2))


def test_staleness_bound_holds(ray_cluster, tiny_setup, tmp_path):
    root = tiny_setup
    run(common(root, 6) + ["--exp-dir", str(tmp_path / "run"), "--fully-async", "--max-staleness", "2",
                           "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1], '
                                         '"actor_fwd": [1, 1], "advantages": [1, 0]}'])
    rows = by_step(tmp_path / "run")
    assert sorted(rows) == list(range(6))
    lags = [rows[s]["train/max_version_lag"] for s in rows]
    assert max(lags) <= 2
    assert max(lags) >= 1, f"rollout never ran ahead of training (lags {lags}); the pipeline is not overlapping"
    assert all(rows[s]["train/rejected_stale_rows"] == 0 for s in rows)


def test_ppo_critic_streams_in_fully_async_mode(ray_cluster, tiny_setup, tmp_path):
    """The Critic scores rows as they stream in, the Advantages role runs GAE on them, and the
    critic fits the returns after the Actor trained each step."""
    root = tiny_setup
    run(common(root, 3) + ["--exp-dir", str(tmp_path / "ppo"), "--fully-async", "--max-staleness", "1",
                           "--advantage-estimator", "ppo", "--gamma", "1.0", "--lambd", "0.95",
                           "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1], '
                                         '"actor_fwd": [1, 1], "advantages": [1, 0], "critic": [1, 1]}'])
    rows = by_step(tmp_path / "ppo")
    assert sorted(rows) == [0, 1, 2]
    for step, row in rows.items():
        assert row["train/max_version_lag"] <= 1
        assert row["critic/value_loss"] >= 0
        assert row["compute/critic_train_seconds"] > 0
