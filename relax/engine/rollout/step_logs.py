"""What a rollout step and an evaluation log: the default sample statistics, the optional logs
(`--log-multi-turn`, `--log-correct-samples`, `--log-reward-category`) and the user's logging hooks
(`--custom-rollout-log-function-path`, `--custom-eval-rollout-log-function-path`).

Metrics are returned as data (the Controller sends every role's metrics to the sinks in one place);
files go under the run directory. The hooks keep slime's signatures:
`fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time)` after a training step and
`fn(rollout_id, args, data, extra_metrics)` after an evaluation, with `data` = {set name:
{"rewards": [...], "truncated": [...], "samples": [...]}}. As in slime, a hook that returns True
skips the default logging, here the sample statistics: the `<prefix>/...` metrics computed from the
samples (rewards, lengths, truncation, weight versions, pass rates, multi-turn, correct samples,
reward categories) and the files and text they write. The run's operational metrics stay (timings,
engine busy time, reward-executor counters, filter and partial-rollout counts, and
`rollout/num_samples`, which the autoscaler reads). A Relax extension: a hook may return a dict of
metrics, logged in place of the defaults (plugins have no other way to reach the run's sinks).
A sync hook runs in a worker thread (it may write files or call a tracker); an async one is awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from relax.config.checks.plugins import EVAL_LOG_SIGNATURE, ROLLOUT_LOG_SIGNATURE
from relax.config.schema import RelaxConfig
from relax.engine.agentic.records import TEXT_SAMPLES, log_trajectories, multi_turn_metrics
from relax.types import Sample
from relax.utils.metrics import pass_rates
from relax.utils.plugins import load_plugin

KEPT = ("rollout/num_samples",)  # sample statistics kept when a hook skips the defaults (the autoscaler's)


@dataclass(frozen=True)
class LogSpec:
    """The logging flags a Rollout reads (`from_config`)."""

    exp_dir: str = "."
    multi_turn: bool = False
    passrate: bool = False
    correct_samples: bool = False
    reward_category: str | None = None
    rollout_hook: str | None = None
    eval_hook: str | None = None

    @classmethod
    def from_config(cls, cfg: RelaxConfig) -> LogSpec:
        log, r = cfg.logging, cfg.rollout
        return cls(exp_dir=cfg.misc.exp_dir or ".", multi_turn=log.log_multi_turn, passrate=log.log_passrate,
                   correct_samples=log.log_correct_samples, reward_category=log.log_reward_category,
                   rollout_hook=r.custom_rollout_log_function_path, eval_hook=r.custom_eval_rollout_log_function_path)


@dataclass(frozen=True)
class EvalSet:
    """One eval set's result: its groups of samples and each sample's scalar reward (the set's key)."""

    groups: list[list[Sample]]
    rewards: list[list[float]]

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g]

    @property
    def flat_rewards(self) -> list[float]:
        return [r for g in self.rewards for r in g]


class StepLogger:
    """Builds a step's (or an evaluation's) metrics and writes its logs; `args` is what hooks get."""

    def __init__(self, spec: LogSpec, args: Any) -> None:
        self.spec, self.args = spec, args
        self.rollout_hook = load_plugin(spec.rollout_hook, flag="--custom-rollout-log-function-path", positional=5,
                                        expected=ROLLOUT_LOG_SIGNATURE) if spec.rollout_hook else None
        self.eval_hook = load_plugin(spec.eval_hook, flag="--custom-eval-rollout-log-function-path", positional=4,
                                     expected=EVAL_LOG_SIGNATURE) if spec.eval_hook else None

    async def rollout(self, rollout_id: int, samples: list[Sample], rewards: list[float], extra: dict[str, Any],
                      rollout_time: float) -> dict[str, Any]:
        """A training step's metrics: `extra` (operational) and `time/rollout`, plus the sample statistics
        unless the hook skips them."""
        ops = {**extra, "time/rollout": rollout_time}
        if self.rollout_hook:
            verdict = await _call(self.rollout_hook, rollout_id, self.args, samples, dict(extra), rollout_time)
            if verdict is True or isinstance(verdict, dict):
                kept = {k: v for k, v in sample_metrics(samples, rewards, "rollout").items() if k in KEPT}
                return kept | ops | (verdict if isinstance(verdict, dict) else {})
        return await asyncio.to_thread(self._rollout_defaults, rollout_id, samples, rewards) | ops

    def _rollout_defaults(self, rollout_id: int, samples: list[Sample], rewards: list[float]) -> dict[str, Any]:
        s = self.spec
        out = sample_metrics(samples, rewards, "rollout")
        if s.multi_turn:
            out |= log_trajectories(s.exp_dir, f"rollout_{rollout_id}", samples, "rollout")
        if s.correct_samples:
            out |= log_correct_samples(s.exp_dir, rollout_id, samples, rewards)
        if s.reward_category:
            out |= reward_category_metrics(samples, rewards, s.reward_category, "rollout")
        return out

    async def evaluation(self, rollout_id: int, sets: dict[str, EvalSet], extra: dict[str, Any]) -> dict[str, Any]:
        """An evaluation's metrics: `extra` (per-set times) plus each set's statistics unless the hook
        skips them."""
        if self.eval_hook:
            data = {name: {"rewards": e.flat_rewards, "samples": e.samples,
                           "truncated": [s.status == Sample.Status.TRUNCATED for s in e.samples]}
                    for name, e in sets.items()}
            verdict = await _call(self.eval_hook, rollout_id, self.args, data, dict(extra))
            if verdict is True or isinstance(verdict, dict):
                return {**extra, **(verdict if isinstance(verdict, dict) else {})}
        out = dict(extra)
        for name, e in sets.items():
            out |= await asyncio.to_thread(self._eval_defaults, rollout_id, name, e)
        return out

    def _eval_defaults(self, rollout_id: int, name: str, e: EvalSet) -> dict[str, Any]:
        s, prefix = self.spec, f"eval/{name}"
        out = sample_metrics(e.samples, e.flat_rewards, prefix)
        if s.multi_turn:
            out |= log_trajectories(s.exp_dir, f"eval_{name}_{rollout_id}", e.samples, prefix)
        if s.passrate:  # a sample counts as correct when its reward is > 0
            out |= pass_rates([[r > 0 for r in g] for g in e.rewards], prefix=prefix)
        if s.reward_category:
            out |= reward_category_metrics(e.samples, e.flat_rewards, s.reward_category, prefix)
        return out


async def _call(hook: Callable[..., Any], *args: Any) -> Any:
    if inspect.iscoroutinefunction(hook):
        return await hook(*args)
    return await asyncio.to_thread(hook, *args)


def sample_metrics(samples: list[Sample], rewards: list[float], prefix: str) -> dict[str, float]:
    """The default statistics of a step's (or eval set's) samples; `rewards`: their scalar rewards."""
    lengths = [s.response_length for s in samples]
    versions = [v for s in samples for v in s.weight_versions]
    return multi_turn_metrics(samples, prefix) | {
        f"{prefix}/reward_mean": statistics.fmean(rewards),
        f"{prefix}/response_len_mean": statistics.fmean(lengths),
        f"{prefix}/truncated_frac": sum(s.status == Sample.Status.TRUNCATED for s in samples) / len(samples),
        f"{prefix}/num_samples": float(len(samples)),
        f"{prefix}/weight_version_min": float(min(versions)) if versions else -1.0,
    }


def log_correct_samples(exp_dir: str, rollout_id: int, samples: list[Sample], rewards: list[float]) -> dict[str, Any]:
    """--log-correct-samples: the step's correct samples (reward > 0) to
    `<exp_dir>/correct_samples/rollout_<id>.jsonl` (one JSON object per sample), their count, share and
    mean response length as metrics, and a few as text for the sinks that show text."""
    correct = [(s, r) for s, r in zip(samples, rewards) if r > 0]
    directory = os.path.join(exp_dir, "correct_samples")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rollout_{rollout_id}.jsonl"), "w") as f:
        for s, r in correct:
            f.write(json.dumps({"index": s.index, "group_index": s.group_index, "prompt": s.prompt,
                                "response": s.response, "label": s.label, "reward": r,
                                "response_length": s.response_length}, default=repr) + "\n")
    out: dict[str, Any] = {"rollout/correct_samples": float(len(correct)),
                           "rollout/correct_frac": len(correct) / len(samples)}
    if correct:
        out["rollout/correct_response_len_mean"] = statistics.fmean(s.response_length for s, _ in correct)
        out["text/rollout/correct_samples"] = "\n\n---\n\n".join(
            f"sample {s.index} (reward {r:g}):\n\n{_text(s.prompt)}\n\n**response**: {s.response}"
            for s, r in correct[:TEXT_SAMPLES])
    return out


def _text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, default=repr)


def reward_category_metrics(samples: list[Sample], rewards: list[float], key: str, prefix: str) -> dict[str, float]:
    """--log-reward-category KEY: per value of `sample.reward[KEY]` its count, share of the samples and
    mean scalar reward (`<prefix>/reward_category/<value>/count|frac|reward_mean`); samples whose reward
    has no such key (a failed reward scores a plain number) count as `missing`."""
    by: dict[str, list[float]] = {}
    for s, r in zip(samples, rewards):
        value = s.reward.get(key) if isinstance(s.reward, dict) else None
        name = "missing" if value is None else str(value).replace("/", "_").replace(" ", "_")
        by.setdefault(name, []).append(r)
    out: dict[str, float] = {}
    for name, values in sorted(by.items()):
        base = f"{prefix}/reward_category/{name}"
        out |= {f"{base}/count": float(len(values)), f"{base}/frac": len(values) / len(samples),
                f"{base}/reward_mean": statistics.fmean(values)}
    return out
