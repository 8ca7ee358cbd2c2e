"""The autoscaler's YAML (`--autoscaler-config`): bounds, the signal it targets, thresholds, cooldown, step.

Loaded and checked once at config time (a wrong key or value fails the run before Ray starts, naming
the key and the fix); `relax.engine.elastic.autoscaler` decides with it. Every target metric grows
with the demand for rollout: above `scale_out_threshold` the fleet grows, below `scale_in_threshold`
it shrinks (and, with `idle_utilization`, only while the engines are idle enough that the others
absorb the load: shrinking keeps the throughput). Example (docs/elastic-scaling.md):

    min_engines: 1
    max_engines: 4
    target_metric: trainer_wait     # fraction of the trainer's step spent waiting for samples
    scale_out_threshold: 0.3
    scale_in_threshold: 0.05
    cooldown_s: 60
    step_size: 1
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# target_metric -> what it measures (every one grows with the demand for rollout)
TARGET_METRICS: dict[str, str] = {
    "trainer_wait": "fraction of the trainer's last step spent waiting for rollout samples (0-1)",
    "queue_depth": "requests in flight per engine at the router, averaged over the engines",
    "utilization": "fraction of wall time the engines spent decoding since the last decision (0-1)",
    "staleness_headroom": "fully async: weight versions the rollout may still run ahead (--max-staleness minus "
                          "how far ahead it is); small when rollout outpaces training",
}


@dataclass(frozen=True)
class AutoscalerConfig:
    min_engines: int = 1
    max_engines: int = 4
    target_metric: str = "trainer_wait"
    scale_out_threshold: float = 0.3
    scale_in_threshold: float = 0.05
    cooldown_s: float = 60.0  # seconds after a fleet change before the next decision may change it
    step_size: int = 1  # engines added or removed per decision
    interval_s: float = 10.0  # seconds between decisions
    idle_utilization: float = 1.0  # shrink only while the engines' utilization is at most this (1: always)


def autoscaler_config(values: dict[str, Any], source: str = "--autoscaler-config") -> AutoscalerConfig:
    """Check `values` (the YAML's mapping) and build the config; ValueError naming the key and the fix."""
    if not isinstance(values, dict):
        raise ValueError(f"{source}: expected a mapping of key: value, got {type(values).__name__}")
    known = {f.name: f for f in dataclasses.fields(AutoscalerConfig)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; known: {sorted(known)}")
    typed: dict[str, Any] = {}
    for key, value in values.items():
        want = int if known[key].type == "int" else float if known[key].type == "float" else str
        if isinstance(value, bool) or not isinstance(value, (int, float) if want is float else want):
            raise ValueError(f"{source}: {key} must be {want.__name__}, got {value!r}")
        typed[key] = want(value)
    cfg = AutoscalerConfig(**typed)
    _check(cfg, source)
    return cfg


def _check(c: AutoscalerConfig, source: str) -> None:
    problems = []
    if c.min_engines < 1:
        problems.append(f"min_engines must be >= 1, got {c.min_engines}")
    if c.max_engines < c.min_engines:
        problems.append(f"max_engines ({c.max_engines}) must be >= min_engines ({c.min_engines})")
    if c.target_metric not in TARGET_METRICS:
        problems.append(f"target_metric {c.target_metric!r} is not one of {sorted(TARGET_METRICS)}")
    if not c.scale_in_threshold < c.scale_out_threshold:
        problems.append(f"scale_in_threshold ({c.scale_in_threshold}) must be below scale_out_threshold "
                        f"({c.scale_out_threshold}), else every decision could both grow and shrink")
    if c.cooldown_s < 0 or c.interval_s <= 0:
        problems.append(f"cooldown_s must be >= 0 and interval_s > 0, got {c.cooldown_s} and {c.interval_s}")
    if c.step_size < 1:
        problems.append(f"step_size must be >= 1, got {c.step_size}")
    if not 0 <= c.idle_utilization <= 1:
        problems.append(f"idle_utilization must be in [0, 1], got {c.idle_utilization}")
    if problems:
        raise ValueError(f"{source}: " + "; ".join(problems))


def load_autoscaler_config(path: str) -> AutoscalerConfig:
    """The YAML file at `path` as an `AutoscalerConfig` (ValueError naming the file and the key)."""
    import yaml

    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ValueError(f"--autoscaler-config {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--autoscaler-config {path}: not valid YAML ({exc})") from None
    return autoscaler_config(values, f"--autoscaler-config {path}")
