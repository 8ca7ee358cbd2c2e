"""The elastic-scaling flags (`relax.config.elastic`): ranges and the autoscaler YAML, before Ray starts."""

from __future__ import annotations

from relax.config.elastic import check_elastic as check_values
from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig


def check_elastic(cfg: RelaxConfig) -> None:
    """Ranges, the autoscaler YAML, and what needs engines the run launches."""
    try:
        check_values(cfg.elastic)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.elastic.autoscaler_config and (cfg.debug.debug_train_only or cfg.debug.load_debug_rollout_data):
        raise ConfigError("--autoscaler-config scales the rollout engines, and --debug-train-only / "
                          "--load-debug-rollout-data start none: drop --autoscaler-config")
