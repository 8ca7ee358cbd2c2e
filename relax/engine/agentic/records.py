"""What a step's multi-turn samples leave behind: metrics, the combined reward, the trajectory log.

Metrics (under the rollout's prefix, `rollout/` or `eval/<name>/`; only for samples an episode
produced, i.e. with `metadata["termination"]`):

    <prefix>/multi_turn/turns_mean             model turns per sample
    <prefix>/multi_turn/tool_calls_per_sample  tool calls per sample
    <prefix>/multi_turn/tool_call_rate         fraction of samples with at least one tool call
    <prefix>/multi_turn/env_errors             samples an environment failure ended (error or timeout)
    <prefix>/multi_turn/turn_reward_mean       summed step rewards per sample (when any were given)
    <prefix>/termination/<reason>              fraction of samples per termination reason (every
                                               reason of `TERMINATIONS`, zeros included)

A black-box agent's samples (agent.py, `metadata["agent_segments"]`) count their gateway calls as
turns and report `multi_turn/agent_errors` (error or timeout) and `multi_turn/agent_segments_mean`
(segments per episode: above 1 when the agent rewrote its history) instead of `env_errors`, and
the reasons of `AGENT_TERMINATIONS`.

Reward rule (`--turn-reward`): `final` keeps the reward function's score; `sum` adds the sum of the
sample's step rewards (`metadata["turn_rewards"]`) to it (to `reward[--reward-key]` for dict rewards).

Trajectory log (`--log-multi-turn`): one JSON line per sample in `<exp-dir>/multi_turn/<name>.jsonl`
(index, group, label, reward, status, turns, termination, tool calls, step rewards, env error and
the turn-by-turn trajectory: each model turn's text and tokens, each observation's text, tokens,
media counts and info), and a few trajectories as text (`text/<prefix>/multi_turn/trajectories`)
for the metrics sinks that show text.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from relax.engine.agentic.env import ENV_ERROR, ENV_TIMEOUT
from relax.engine.agentic.episode import AGENT_ERROR, AGENT_TERMINATIONS, AGENT_TIMEOUT, TERMINATIONS
from relax.types import Sample

TEXT_SAMPLES = 2  # trajectories per step sent to the sinks as text


def episodes(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if isinstance(s.metadata, dict) and "termination" in s.metadata]


def multi_turn_metrics(samples: list[Sample], prefix: str) -> dict[str, float]:
    """The step's multi-turn metrics (module doc); {} when no sample came from an episode."""
    done = episodes(samples)
    if not done:
        return {}
    calls = [int(s.metadata.get("tool_calls", 0)) for s in done]
    agent = any("agent_segments" in s.metadata for s in done)
    errors, reasons = ((AGENT_ERROR, AGENT_TIMEOUT), AGENT_TERMINATIONS) if agent else \
        ((ENV_ERROR, ENV_TIMEOUT), TERMINATIONS)
    out = {f"{prefix}/multi_turn/turns_mean": statistics.fmean(int(s.metadata.get("turns", 0)) for s in done),
           f"{prefix}/multi_turn/tool_calls_per_sample": statistics.fmean(calls),
           f"{prefix}/multi_turn/tool_call_rate": sum(c > 0 for c in calls) / len(done),
           f"{prefix}/multi_turn/{'agent' if agent else 'env'}_errors":
               float(sum(s.metadata["termination"] in errors for s in done))}
    if agent:
        out[f"{prefix}/multi_turn/agent_segments_mean"] = statistics.fmean(
            int(s.metadata.get("agent_segments", 0)) for s in done)
    rewards = [sum(s.metadata["turn_rewards"]) for s in done if s.metadata.get("turn_rewards")]
    if rewards:
        out[f"{prefix}/multi_turn/turn_reward_mean"] = statistics.fmean(rewards)
    for reason in reasons:
        out[f"{prefix}/termination/{reason}"] = sum(s.metadata["termination"] == reason for s in done) / len(done)
    return out


def add_turn_rewards(samples: list[Sample], mode: str, reward_key: str | None) -> None:
    """Apply the `--turn-reward` rule to scored samples (module doc)."""
    if mode == "final":
        return
    if mode != "sum":
        raise ValueError(f"--turn-reward must be final or sum, got {mode!r}")
    for s in episodes(samples):
        extra = sum(s.metadata.get("turn_rewards") or ())
        if isinstance(s.reward, dict):
            s.reward = {**s.reward, reward_key: float(s.reward[reward_key]) + extra}
        elif s.reward is not None:
            s.reward = float(s.reward) + extra


def trajectory_record(sample: Sample) -> dict[str, Any]:
    m = sample.metadata
    return {"index": sample.index, "group": sample.group_index, "label": _jsonable(sample.label),
            "reward": _jsonable(sample.reward), "status": sample.status.value, "turns": m.get("turns"),
            "termination": m.get("termination"), "tool_calls": m.get("tool_calls"),
            "turn_rewards": m.get("turn_rewards"), "env_error": m.get("env_error"),
            **({"agent_error": m.get("agent_error"), "agent_segments": m["agent_segments"]}
               if "agent_segments" in m else {}),
            "response_length": sample.response_length, "trajectory": _jsonable(m.get("trajectory"))}


def write_trajectories(directory: str, name: str, samples: list[Sample]) -> str | None:
    """Append the samples' trajectories to `<directory>/<name>.jsonl`; its path (None: no episodes)."""
    done = episodes(samples)
    if not done:
        return None
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.jsonl")
    with open(path, "a", encoding="utf-8") as f:
        for s in done:
            f.write(json.dumps(trajectory_record(s)) + "\n")
    return path


def log_trajectories(exp_dir: str, name: str, samples: list[Sample], prefix: str) -> dict[str, str]:
    """`--log-multi-turn` for one step's (or eval set's) samples: the JSONL file under
    `<exp_dir>/multi_turn/`, and a few trajectories as text for the sinks (module doc)."""
    if write_trajectories(os.path.join(exp_dir, "multi_turn"), name, samples) is None:
        return {}
    return {f"text/{prefix}/multi_turn/trajectories": trajectory_text(samples)}


def trajectory_text(samples: list[Sample], limit: int = TEXT_SAMPLES) -> str:
    """A few trajectories as readable text (markdown), for the sinks that show text."""
    blocks = []
    for s in episodes(samples)[:limit]:
        m = s.metadata
        head = (f"sample {s.index}: {m.get('turns')} turns, termination {m.get('termination')}, "
                f"{m.get('tool_calls')} tool calls, reward {_jsonable(s.reward)}")
        turns = [f"**{t.get('role')}** ({t.get('tokens', 0)} tokens): {t.get('text', '')}"
                 for t in m.get("trajectory") or []]
        blocks.append("\n\n".join([head, *turns]))
    return "\n\n---\n\n".join(blocks)


def _jsonable(value: Any) -> Any:
    """`value` with anything JSON cannot hold as its repr (an environment's info may hold objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)[:200]
