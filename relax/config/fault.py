"""The fault-tolerance flags (`FaultConfig`) and the one deadline derived from them.

`--use-fault-tolerance` turns on tier 1 (engine health checks every `--rollout-health-check-interval`
seconds; a dead or hung engine is replaced in place, its requests re-sent; at most
`--max-engine-replacements` times per engine slot); `--use-health-check` turns on role heartbeats
and tier 2 (a global restart from the last checkpoint, at most `--max-global-restart` times).
`relax.core.health` carries them out; docs/operations.md says what each does. What the flags
require of each other is checked in `relax.config.checks.fault`.
"""

from __future__ import annotations

from relax.config.schema import RelaxConfig


def recovery_window_s(cfg: RelaxConfig) -> float:
    """How long a failed engine may take to be found and replaced by a fresh one holding the current
    weights: one health-check interval and timeout, an engine start and a weight push. Requests and
    fleet calls of a failed engine wait this long for its replacement (`FleetSpec.hold_s`), and a
    weight push that failed on it waits this long for the new topology."""
    f, r = cfg.fault, cfg.rollout
    return (f.rollout_health_check_first_wait + f.rollout_health_check_interval + f.rollout_health_check_timeout
            + r.engine_startup_timeout + r.weight_sync_timeout)
