"""The elastic-scaling flags (`ElasticConfig`, one config group of `schema.RelaxConfig`, kept apart from
schema.py for its size) and their checks.

The five seed flags (`--autoscaler-config`, `--scale-out-timeout`, `--scale-out-partial-success-policy`,
`--scale-in-drain-timeout`, `--scale-in-shutdown-timeout`) govern the operations of
`relax.engine.elastic`; three Relax extensions say where the scaling REST API listens (on in every run
that launches engines, loopback by default). docs/elastic-scaling.md says what each does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from relax.config.fields import opt

PartialSuccessPolicy = Literal["rollback_all", "keep_partial"]
PARTIAL_SUCCESS_POLICIES = get_args(PartialSuccessPolicy)


@dataclass(frozen=True)
class ElasticConfig:
    """Elastic rollout scaling: the REST API, its operations and the autoscaler (docs/elastic-scaling.md)."""

    autoscaler_config: str | None = opt(
        None, "Path to autoscaler YAML configuration file. Enables autoscaling when set, disabled when not set "
        "(keys: min_engines, max_engines, target_metric, scale_out_threshold, scale_in_threshold, cooldown_s, "
        "step_size, interval_s; docs/elastic-scaling.md).")
    scale_out_timeout: float = opt(300.0, "Timeout for all scale-out operations (engine startup, connect, health "
                                   "check, weight sync) in seconds.")
    scale_out_partial_success_policy: PartialSuccessPolicy = opt(
        "rollback_all", "Policy for partial success during scale-out. rollback_all reverts all engines on any "
        "failure; keep_partial keeps successfully scaled engines.")
    scale_in_drain_timeout: float = opt(30.0, "Timeout to wait for in-flight requests to drain before force-aborting "
                                        "(seconds); aborted requests are re-sent to the other engines (with "
                                        "--partial-rollout they keep the tokens generated so far).")
    scale_in_shutdown_timeout: float = opt(30.0, "Timeout for graceful engine shutdown; the process is killed if "
                                           "exceeded (seconds).")
    scale_api: bool = opt(True, "Relax extension: serve the scaling REST API (GET /fleet, POST /scale_out, POST "
                          "/scale_in, GET /operations/{id}, POST /operations/{id}/cancel) in runs that launch "
                          "rollout engines; every request needs the bearer token in <exp-dir>/.relax/scale_token.")
    scale_api_host: str = opt("127.0.0.1", "Relax extension: address the scaling REST API binds (loopback: only "
                              "this machine can reach it; use the node's private address for another host).")
    scale_api_port: int = opt(0, "Relax extension: port of the scaling REST API (0: a free one; relax-scale finds "
                              "it in <exp-dir>/.relax/scale_api.json).")


def serves_scaling_api(cfg: Any) -> bool:
    """Whether the run serves the scaling API: --scale-api on and rollout engines to scale (a replay of
    saved rollouts, --debug-train-only or --load-debug-rollout-data, has none)."""
    return cfg.elastic.scale_api and not (cfg.debug.debug_train_only or cfg.debug.load_debug_rollout_data)


def check_elastic(values: ElasticConfig) -> None:
    """Ranges of the elastic flags, and the autoscaler YAML parsed once (its own errors name the key).
    Raises ValueError naming the flag and the fix."""
    for name in ("scale_out_timeout", "scale_in_drain_timeout", "scale_in_shutdown_timeout"):
        value = getattr(values, name)
        if not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds, got {value}")
    if not 0 <= values.scale_api_port <= 65535:
        raise ValueError(f"--scale-api-port must be 0 (a free port) or a port number up to 65535, got "
                         f"{values.scale_api_port}")
    if values.autoscaler_config:
        from relax.config.autoscaler import load_autoscaler_config

        load_autoscaler_config(values.autoscaler_config)
