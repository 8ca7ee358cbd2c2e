"""The real service graph on CPU: Ray Serve roles, TransferQueue, `hf` engines over HTTP,
FSDP training, weight sync. A few GRPO steps must raise the reward, and the weight version
stamped on samples must advance with every step. The run is a real `relax-train` subprocess
with its own Ray, which must exit 0 and leave no process behind (the normal-exit case of
test_process_cleanup.py)."""

from __future__ import annotations

import pytest
from run_helpers import check_trained, read_metrics
from subprocess_runs import Run, wait_until_gone

pytestmark = pytest.mark.integration


def test_colocate_grpo_learns_versions_advance_and_the_run_exits_clean(tiny_setup, tmp_path, alert_endpoint):
    root = tiny_setup
    alert_url, alerts = alert_endpoint
    run = Run(root, tmp_path, 0, args=[
        "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.integration.digit_reward.reward_func",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "8",
        "--num-rollout", "8", "--lr", "2e-2", "--rollout-shuffle",
        "--resource", '{"actor": [1, 2], "rollout": [1, 2]}',
        "--progress-bar", "false", "--save", str(tmp_path / "ckpt"), "--save-interval", "4",
        "--save-hf", str(tmp_path / "hf"), "--notify-urls", alert_url,
        "--timeline-dump-dir", str(tmp_path / "timeline"),
    ])
    run.proc.wait(timeout=600)
    assert run.proc.returncode == 0, run.output()[-3000:]
    assert "step 8/8" in run.output()
    assert [a["title"].rsplit(": ", 1)[1] for a in alerts] == ["run started", "run finished"], alerts
    _check_colocate_timeline(tmp_path / "timeline" / "timeline.json")
    assert wait_until_gone(run.marker, timeout=10) == []
    rows = [r for r in read_metrics(tmp_path) if "rollout/reward_mean" in r]
    rewards = [r["rollout/reward_mean"] for r in rows]
    versions = [r["rollout/weight_version_min"] for r in rows]
    assert versions == list(range(len(rows))), versions  # step k generated with weights of version k
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.1, rewards
    assert all(r["train/ppo_kl"] == pytest.approx(0.0, abs=1e-5) for r in rows)  # one update per rollout: ratio 1
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "7"

    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf") is not None


def _check_colocate_timeline(path) -> None:
    """--timeline-dump-dir in colocate: per step the Controller's phases in order, and the roles'
    own spans (the Rollout generating, the Actor training) inside them."""
    import json

    trace = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    spans = [e for e in trace if e["ph"] == "X"]
    phases = [e["name"] for e in spans if names[e["pid"]] == "controller" and e["args"].get("step") == 2]
    assert phases == ["rollout", "release engines + onload trainers", "score", "train", "weight sync"], phases
    step2 = {e["name"]: e for e in spans if names[e["pid"]] == "controller" and e["args"].get("step") == 2}
    generate = next(e for e in spans if names[e["pid"]] == "rollout" and e["name"] == "generate"
                    and e["args"].get("step") == 2)
    train = next(e for e in spans if names[e["pid"]] == "actor" and e["name"] == "train" and e["args"].get("step") == 2)
    for inner, outer in ((generate, step2["rollout"]), (train, step2["train"])):
        assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_custom_multiturn_generate_trains_with_masked_observations(plugin_run):
    """The built-in multi-turn rollout with an environment, through the plugin path (the seeds'
    copied rollout.py, tests/integration/multiturn_generate.py), for training and eval alike."""
    rows = [r for r in read_metrics(plugin_run) if "train/pg_loss" in r]
    assert len(rows) == 3 and all(r["train/passes"] == 2.0 for r in rows)
    check_trained(rows, single_pass=False)  # reinforce_plus_plus (test_estimators)
    # every episode: model turn, tool observation, model turn, then the environment is done
    assert all(r["rollout/multi_turn/turns_mean"] == 2.0 and r["rollout/termination/env_done"] == 1.0
               and r["rollout/multi_turn/tool_calls_per_sample"] == 1.0 and r["rollout/multi_turn/env_errors"] == 0
               for r in rows)
    # two short model turns and the observation's ids (its template delimiters included)
    assert all(r["rollout/response_len_mean"] > 8 for r in rows)
    # masked observation tokens carry log-prob 0 and are excluded from the mismatch metric: the
    # recomputed log-probs still match the engine's on the trained (model) tokens
    assert all(r["train/train_rollout_logprob_abs_diff_max"] < 1e-3 for r in rows)
    evals = [r for r in read_metrics(plugin_run) if "eval/tiny/multi_turn/turns_mean" in r]
    assert len(evals) == 1 and evals[0]["eval/tiny/termination/env_done"] == 1.0


def test_dynamic_sampling_drops_constant_groups_and_fills_the_batch(plugin_run):
    rows = [r for r in read_metrics(plugin_run) if "rollout/num_samples" in r and "train/pg_loss" in r]
    assert [r["rollout/num_samples"] for r in rows] == [32.0, 32.0, 32.0]  # always a full batch
    dropped = sum(r.get("rollout/filter_dropped_groups", 0.0) for r in rows)
    reasons = sum(v for r in rows for k, v in r.items() if k.startswith("rollout/filter_drop/"))
    assert dropped > 0 and reasons == dropped
    evals = [r for r in read_metrics(plugin_run) if "eval/tiny/pass@1" in r]
    assert len(evals) == 1
    assert 0 <= evals[0]["eval/tiny/pass@1"] <= evals[0]["eval/tiny/pass@2"] <= evals[0]["eval/tiny/pass@4"]
