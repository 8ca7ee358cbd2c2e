"""Fully-async mode on CPU: the real roles (Rollout, Actor, ActorFwd, Reference, Advantages,
the DCS coordinator) as Serve deployments streaming through TransferQueue.

Invariants: with --max-staleness 0 the async pipeline trains on exactly what colocate trains
on (same seed -> same per-step rewards and losses; the colocate run is the session's reference
run); with --max-staleness 2 rollout really runs ahead, and no trained row ever lags more than
2 weight versions.
"""

from __future__ import annotations

import pytest
from run_helpers import reference_args, step_rows
from run_helpers import run_relax as run

pytestmark = pytest.mark.integration


def by_step(exp_dir) -> dict[int, dict]:
    return {r["step"]: r for r in step_rows(exp_dir)}


def test_staleness_zero_equals_colocate(reference_run, tiny_setup, tmp_path):
    """The colocate side is the session's reference run (its reference refreshes every 2 steps:
    in fully-async mode the Reference waits for the Actor's save before scoring step 2, so the
    KL is 0 there in both modes)."""
    run(reference_args(tiny_setup, tmp_path / "async", num_rollout=3) + [
        "--fully-async", "--max-staleness", "0",
        "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1], "actor_fwd": [1, 1], '
                      '"advantages": [1, 0]}'])
    sync, fully_async = by_step(reference_run / "run"), by_step(tmp_path / "async")
    assert sorted(fully_async) == [0, 1, 2]
    for step in fully_async:
        assert fully_async[step]["train/max_version_lag"] == 0
        assert fully_async[step]["rollout/reward_mean"] == sync[step]["rollout/reward_mean"], step
        assert fully_async[step]["rollout/response_len_mean"] == sync[step]["rollout/response_len_mean"], step
        for key in ("train/pg_loss", "train/kl_loss", "train/grad_norm"):
            assert fully_async[step][key] == pytest.approx(sync[step][key], rel=1e-4, abs=1e-6), (step, key)
    assert fully_async[1]["train/kl_loss"] > 0 and fully_async[2]["train/kl_loss"] == pytest.approx(0, abs=1e-7)
    # Pushes overlap the next step: step k reports the push that finished during it (version k).
    assert [fully_async[s].get("weight_sync/version") for s in (0, 1, 2)] == [None, 1, 2]
    assert all(fully_async[s]["weight_sync/bytes"] > 0 for s in (1, 2))


@pytest.fixture(scope="module")
def bounded_ppo_run(fully_async_interrupted_run):
    """PPO at --max-staleness 2 with every streaming role: Rollout, Reference, ActorFwd, the Critic
    (values streamed onto rows) and Advantages (GAE), the critic training after the Actor on each
    step; the session's fully-async run, Ctrl-C'd after its fourth step (the first four read)."""
    rows = by_step(fully_async_interrupted_run.exp_dir)
    return {s: rows[s] for s in range(4) if s in rows}


def test_staleness_bound_holds(bounded_ppo_run):
    rows = bounded_ppo_run
    assert sorted(rows) == list(range(4))
    lags = [rows[s]["train/max_version_lag"] for s in rows]
    assert max(lags) <= 2
    assert max(lags) >= 1, f"rollout never ran ahead of training (lags {lags}); the pipeline is not overlapping"
    assert all(rows[s]["train/rejected_stale_rows"] == 0 for s in rows)


def test_ppo_critic_streams_in_fully_async_mode(bounded_ppo_run):
    """The Critic scores rows as they stream in, the Advantages role runs GAE on them, and the
    critic fits the returns after the Actor trained each step."""
    for row in bounded_ppo_run.values():
        assert row["critic/value_loss"] >= 0
        assert row["compute/critic_train_seconds"] > 0


def test_timeline_shows_the_roles_working_at_once(fully_async_interrupted_run):
    """--timeline-dump-dir: the merged trace has a track per streaming role, and rollout work
    overlaps the Actor's training (the point of the mode), even for a run stopped by Ctrl-C."""
    import json

    trace = json.loads((fully_async_interrupted_run.exp_dir / "timeline" / "timeline.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {"controller", "rollout", "actor", "reference", "actor_fwd", "critic", "advantages"} <= set(names.values())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    by_role = {role: [e for e in spans if names[e["pid"]] == role] for role in names.values()}
    trains = [(e["ts"], e["ts"] + e["dur"]) for e in by_role["actor"] if e["name"] == "train"]
    assert len(trains) >= 4
    rollout = [(e["ts"], e["ts"] + e["dur"]) for e in by_role["rollout"] if e["name"] == "generate"]
    assert any(a < d and c < b for a, b in trains for c, d in rollout), "no rollout work overlapped training"
    assert {"wait for rollout", "train", "weight sync"} <= {e["name"] for e in by_role["controller"]}
