"""Run a whole training job in-process on the session's Ray cluster, and read its metrics."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

from relax.config import parse_config
from relax.core.controller import _run
from relax.core.service import Runtime


def start_session_cluster(repo_root: str) -> None:
    """Ray, TransferQueue and Serve up for a session of runs (the integration tests' `ray_cluster`,
    bench/run_cost.py): each run attaches to them and leaves them up."""
    import os

    import ray
    from ray import serve

    from relax.distributed import transfer_queue as tq
    from relax.distributed.ray.local import start_local_ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The repository on every Ray process's path (the tests' plugins), inherited: no job runtime_env.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH")) if p)
    start_local_ray(8, log_to_driver=False)
    # No log monitor: with log_to_driver off nobody reads what it forwards, and it re-reads the
    # session's hundreds of worker log files ten times a second (~45 s of CPU over the session, measured).
    ray._private.worker._global_node.kill_log_monitor()
    tq.init_data_system()  # one data system for the session: each run attaches, clears it, leaves it
    # Serve up for the session as well: each run deploys its apps and deletes them, and leaves a
    # Serve it did not start (one controller start and graceful shutdown fewer per run, ~3 s of CPU).
    serve.start(proxy_location="Disabled")


def run_relax(args: list[str]) -> dict:
    """Parse, validate and run `args` like `relax-train` does; returns the eval summary."""
    cfg = parse_config(args)
    with Runtime(cfg) as runtime:
        return asyncio.run(_run(cfg, runtime))


def read_metrics(exp_dir: Path) -> list[dict]:
    with open(Path(exp_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def step_rows(exp_dir: Path) -> list[dict]:
    """One row per training step (eval-only rows left out)."""
    return [r for r in read_metrics(exp_dir) if "time/step" in r]


def check_trained(steps: list[dict], *, single_pass: bool = True) -> None:
    """Finite losses, a non-zero gradient somewhere, and (one pass per step) a PPO ratio of
    exactly 1: the first pass trains on the policy that sampled."""
    assert steps
    assert all(math.isfinite(r["train/pg_loss"]) and math.isfinite(r["train/grad_norm"]) for r in steps)
    assert any(r["train/grad_norm"] > 0 for r in steps)
    if single_pass:
        assert all(abs(r["train/ppo_kl"]) <= 1e-5 for r in steps), [r["train/ppo_kl"] for r in steps]


def reference_args(root, exp_dir, num_rollout: int = 4, *, reference: bool = True) -> list[str]:
    """The shared colocate GRPO run's flags (see the `reference_run` fixture); `reference=False`
    leaves out its reference model (KL logged with weight 0, refreshed every 2 steps)."""
    args = ["--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
            "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--rollout-shuffle",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
            "--lr", "1e-2", "--progress-bar", "false", "--num-rollout", str(num_rollout), "--exp-dir", str(exp_dir),
            "--reward-num-workers", "1"]  # (16 samples a step: one reward process, not the default two)
    if not reference:
        return args + ["--resource", '{"actor": [1, 1], "rollout": [1, 1]}']
    # The KL is logged with weight 0 in the loss, so resuming (whose reference restarts from
    # --ref-load until its next refresh) leaves the losses unchanged.
    return args + ["--use-kl-loss", "--kl-loss-coef", "0", "--kl-loss-type", "low_var_kl", "--ref-update-interval",
                   "2", "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}']
