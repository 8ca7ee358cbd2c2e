"""The rollout's logging flags in a real run (the shared plugin run, no run of its own:
tests/integration/conftest.py::plugin_run): --custom-rollout-log-function-path and
--custom-eval-rollout-log-function-path are called with each step's and each evaluation's samples,
and --log-correct-samples writes them. (--sglang-profile is left out of the shared run: the engine's
first torch.profiler start costs seconds; tests/unit/engine/rollout/test_engine_profiling.py and
tests/unit/backends/hf/test_hf_profiler.py cover it.)"""

from __future__ import annotations

import json

from run_helpers import read_metrics


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_log_hooks_see_every_step_and_the_evaluation(plugin_run):
    rollouts = lines(plugin_run / "log_hooks" / "rollout.jsonl")
    assert [r["rollout_id"] for r in rollouts] == [0, 1, 2] and all(r["samples"] == 32 for r in rollouts)
    assert all(r["time"] > 0 and "reward/samples" in r["extra"] for r in rollouts)
    (evaluation,) = lines(plugin_run / "log_hooks" / "eval.jsonl")
    assert evaluation["rollout_id"] == 3 and evaluation["sets"]["tiny"] > 0
    assert evaluation["extra"] == ["eval/tiny/time"]


def test_log_correct_samples_writes_each_step_s_correct_samples(plugin_run):
    rows = [r for r in read_metrics(plugin_run) if "rollout/correct_frac" in r]
    assert len(rows) == 3
    for step, row in enumerate(rows):
        written = lines(plugin_run / "correct_samples" / f"rollout_{step}.jsonl")
        assert len(written) == row["rollout/correct_samples"] and all(s["reward"] > 0 for s in written)

