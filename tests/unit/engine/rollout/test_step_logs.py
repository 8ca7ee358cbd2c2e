"""What a step and an evaluation log (`relax.engine.rollout.step_logs`): slime's logging hooks
(--custom-rollout-log-function-path, --custom-eval-rollout-log-function-path), --log-correct-samples
and --log-reward-category."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import rollout_log_hooks as hooks

from relax.config import ConfigError, parse_config
from relax.engine.rollout.step_logs import EvalSet, LogSpec, StepLogger
from relax.types import Sample

HOOKS = hooks.__name__
EXTRA = {"reward/samples": 4.0, "compute/generate_seconds": 0.5}


def samples(rewards: list, lengths: tuple[int, ...] = (3, 5, 7, 9)) -> list[Sample]:
    out = []
    for i, (reward, n) in enumerate(zip(rewards, lengths)):
        s = Sample(index=i, group_index=i // 2, prompt=f"q{i}", response=f"answer {i}", label="4", reward=reward,
                   response_length=n, status=Sample.Status.TRUNCATED if i == 3 else Sample.Status.COMPLETED)
        s.weight_versions = [2]
        out.append(s)
    return out


def scalar(batch: list[Sample]) -> list[float]:
    return [s.get_reward_value("score") if isinstance(s.reward, dict) else float(s.reward) for s in batch]


def test_without_hooks_a_step_logs_the_default_statistics_and_its_operational_metrics(tmp_path):
    batch = samples([1.0, 0.0, 1.0, 0.0])
    out = asyncio.run(StepLogger(LogSpec(exp_dir=str(tmp_path)), None).rollout(5, batch, scalar(batch), EXTRA, 2.0))
    assert out["rollout/reward_mean"] == 0.5 and out["rollout/response_len_mean"] == 6.0
    assert out["rollout/truncated_frac"] == 0.25 and out["rollout/weight_version_min"] == 2.0
    assert out["time/rollout"] == 2.0 and out["reward/samples"] == 4.0


def test_custom_rollout_log_function_gets_the_step_and_true_skips_the_default_statistics():
    hooks.CALLS.clear()
    args, batch = SimpleNamespace(lr=1e-6), samples([1.0, 0.0, 1.0, 0.0])
    logger = StepLogger(LogSpec(rollout_hook=f"{HOOKS}.skip_defaults"), args)
    out = asyncio.run(logger.rollout(7, batch, scalar(batch), EXTRA, 1.5))
    (call,) = hooks.CALLS
    assert call == ("rollout", 7, args, batch, EXTRA, 1.5)  # slime's (rollout_id, args, samples, extra, time)
    assert "rollout/reward_mean" not in out and "rollout/response_len_mean" not in out
    # what the run itself needs stays: timings, counters, and the sample count the autoscaler reads
    assert out == {**EXTRA, "time/rollout": 1.5, "rollout/num_samples": 4.0}


def test_a_hook_returning_a_dict_logs_it_instead_of_the_defaults_and_false_keeps_them():
    batch = samples([1.0, 0.0, 1.0, 0.0])
    own = asyncio.run(StepLogger(LogSpec(rollout_hook=f"{HOOKS}.own_metrics"), None).rollout(
        0, batch, scalar(batch), EXTRA, 1.0))
    assert own["custom/longest_response"] == 9.0 and "rollout/reward_mean" not in own
    hooks.CALLS.clear()
    kept = asyncio.run(StepLogger(LogSpec(rollout_hook=f"{HOOKS}.keep_defaults"), None).rollout(
        3, batch, scalar(batch), EXTRA, 1.0))
    assert hooks.CALLS == [("async", 3)] and kept["rollout/reward_mean"] == 0.5  # an async hook is awaited


def test_custom_eval_rollout_log_function_gets_every_set_and_true_skips_their_statistics():
    hooks.CALLS.clear()
    batch = samples([1.0, 0.0, 1.0, 0.0])
    sets = {"tiny": EvalSet([batch[:2], batch[2:]], [[1.0, 0.0], [1.0, 0.0]])}
    logger = StepLogger(LogSpec(eval_hook=f"{HOOKS}.skip_eval", passrate=True), "args")
    out = asyncio.run(logger.evaluation(4, sets, {"eval/tiny/time": 0.25}))
    (_, rollout_id, args, data, extra), = hooks.CALLS
    assert (rollout_id, args, extra) == (4, "args", {"eval/tiny/time": 0.25})
    assert data["tiny"]["rewards"] == [1.0, 0.0, 1.0, 0.0] and data["tiny"]["samples"] == batch
    assert data["tiny"]["truncated"] == [False, False, False, True]
    assert out == {"eval/tiny/time": 0.25}
    defaults = asyncio.run(StepLogger(LogSpec(passrate=True), None).evaluation(4, sets, {}))
    assert defaults["eval/tiny/reward_mean"] == 0.5 and defaults["eval/tiny/pass@2"] == 1.0


def test_log_correct_samples_writes_their_text_and_counts_them(tmp_path):
    batch = samples([1.0, 0.0, 0.5, 0.0])
    out = asyncio.run(StepLogger(LogSpec(exp_dir=str(tmp_path), correct_samples=True), None).rollout(
        2, batch, scalar(batch), {}, 1.0))
    rows = [json.loads(line) for line in (tmp_path / "correct_samples" / "rollout_2.jsonl").read_text().splitlines()]
    assert [(r["index"], r["response"], r["reward"]) for r in rows] == [(0, "answer 0", 1.0), (2, "answer 2", 0.5)]
    assert out["rollout/correct_samples"] == 2.0 and out["rollout/correct_frac"] == 0.5
    assert out["rollout/correct_response_len_mean"] == 5.0
    assert "answer 0" in out["text/rollout/correct_samples"] and "answer 1" not in out["text/rollout/correct_samples"]


def test_log_reward_category_reports_each_category_of_the_reward_dict(tmp_path):
    rewards = [{"score": 1.0, "why": "correct"}, {"score": 0.0, "why": "format"}, {"score": 0.0, "why": "format"}, 0.0]
    batch = samples(rewards)
    batch[3].reward = 0.0  # a failed reward scores a plain number: no category
    logger = StepLogger(LogSpec(exp_dir=str(tmp_path), reward_category="why"), None)
    out = asyncio.run(logger.rollout(0, batch, scalar(batch), {}, 1.0))
    assert out["rollout/reward_category/format/count"] == 2.0 and out["rollout/reward_category/format/frac"] == 0.5
    assert out["rollout/reward_category/correct/reward_mean"] == 1.0
    assert out["rollout/reward_category/missing/count"] == 1.0
    sets = {"tiny": EvalSet([batch[:2]], [[1.0, 0.0]])}
    evaluated = asyncio.run(logger.evaluation(0, sets, {}))
    assert evaluated["eval/tiny/reward_category/correct/frac"] == 0.5


def test_log_hooks_and_reward_category_are_checked_when_the_flags_are_parsed(base):
    with pytest.raises(ConfigError, match=r"--custom-rollout-log-function-path.*log_function\(rollout_id, args"):
        parse_config(base + ["--custom-rollout-log-function-path", f"{HOOKS}.too_few"])
    with pytest.raises(ConfigError, match=r"--custom-eval-rollout-log-function-path.*cannot import"):
        parse_config(base + ["--custom-eval-rollout-log-function-path", "no_such_module.hook"])
    cfg = parse_config(base + ["--custom-rollout-log-function-path", f"{HOOKS}.skip_defaults", "--log-correct-samples",
                               "--custom-eval-rollout-log-function-path", f"{HOOKS}.skip_eval"])
    spec = LogSpec.from_config(cfg)
    assert (spec.rollout_hook, spec.eval_hook, spec.correct_samples) == (f"{HOOKS}.skip_defaults",
                                                                         f"{HOOKS}.skip_eval", True)
    with pytest.raises(ConfigError, match="--log-reward-category why.*--reward-key"):
        parse_config(base + ["--log-reward-category", "why"])
    assert LogSpec.from_config(parse_config(base + ["--log-reward-category", "why", "--reward-key", "score"])
                               ).reward_category == "why"
