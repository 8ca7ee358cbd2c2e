"""The fault-tolerance flags (`FaultConfig`): their ranges, and the flags that only act together
with another one (a health-check interval without `--use-fault-tolerance` or `--use-health-check`
would silently do nothing). What the flags do: `relax.config.fault`, docs/operations.md.
"""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig


def check_fault_flags(cfg: RelaxConfig) -> None:
    """Ranges, and the flags that only act together with another one."""
    f, default = cfg.fault, type(cfg.fault)()
    for name in ("rollout_health_check_interval", "rollout_health_check_timeout"):
        if getattr(f, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(f, name)}")
    if f.rollout_health_check_first_wait < 0:
        raise ConfigError(f"--rollout-health-check-first-wait must be >= 0 seconds, got "
                               f"{f.rollout_health_check_first_wait}")
    if f.max_global_restart < 0:
        raise ConfigError(f"--max-global-restart must be >= 0 (0 = never restart), got {f.max_global_restart}")
    if f.max_engine_replacements < 0:
        raise ConfigError(f"--max-engine-replacements must be >= 0 (0 = never replace an engine in place), got "
                          f"{f.max_engine_replacements}")
    if f.max_engine_replacements != default.max_engine_replacements and not f.use_fault_tolerance:
        raise ConfigError(f"--max-engine-replacements {f.max_engine_replacements} bounds the tier-1 engine "
                          "replacements of --use-fault-tolerance, which is off: add --use-fault-tolerance or drop "
                          "the flag")
    if f.max_global_restart != default.max_global_restart and not f.use_health_check:
        raise ConfigError(f"--max-global-restart {f.max_global_restart} bounds the global restarts of "
                               "--use-health-check, which is off: add --use-health-check or drop the flag")
    timing = [name for name in ("rollout_health_check_interval", "rollout_health_check_timeout",
                                "rollout_health_check_first_wait") if getattr(f, name) != getattr(default, name)]
    if cfg.router.use_slime_router:  # the SlimeRouter's own health checks read the interval and the timeout
        timing = [name for name in timing if name == "rollout_health_check_first_wait"]
    if timing and not (f.use_fault_tolerance or f.use_health_check):
        raise ConfigError(f"{', '.join('--' + n.replace('_', '-') for n in timing)}: the engine health checks "
                               "run only with --use-fault-tolerance (replace a failed engine), --use-health-check "
                               "(restart the run from its last checkpoint) or --use-slime-router (interval and "
                               "timeout): add one or drop the flag")
    if f.use_fault_tolerance and (cfg.debug.debug_train_only or cfg.debug.load_debug_rollout_data):
        raise ConfigError("--use-fault-tolerance watches the rollout engines, and --debug-train-only / "
                               "--load-debug-rollout-data start none: drop --use-fault-tolerance")
    if f.use_fault_tolerance and cfg.rollout.sglang_router_ip:
        raise ConfigError("--use-fault-tolerance re-sends the requests of a failed engine through Relax's "
                               "built-in router, and --sglang-router-ip/--sglang-router-port route through another "
                               "one: drop one of them")
    if f.use_fault_tolerance and cfg.rollout.rollout_external:
        raise ConfigError("--use-fault-tolerance replaces a failed engine by launching a fresh one, and "
                               "--rollout-external engines are not launched by Relax: drop --use-fault-tolerance "
                               "(a failed external engine is yours to restart)")
