"""The fault-tolerance flags (`relax.config.checks.fault`): ranges, and the flags that only act
with --use-fault-tolerance or --use-health-check."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config


@pytest.mark.parametrize("extra, needle", [
    (["--max-global-restart", "1"], "--max-global-restart 1 bounds the global restarts of --use-health-check"),
    (["--rollout-health-check-interval", "5"], "the engine health checks run only with --use-fault-tolerance"),
    (["--use-fault-tolerance", "--rollout-health-check-timeout", "0"], "--rollout-health-check-timeout must be > 0"),
    (["--use-health-check", "--max-global-restart", "-1"], "--max-global-restart must be >= 0"),
    (["--max-engine-replacements", "1"], "--max-engine-replacements 1 bounds the tier-1 engine replacements of "
                                         "--use-fault-tolerance, which is off"),
    (["--use-fault-tolerance", "--max-engine-replacements", "-1"], "--max-engine-replacements must be >= 0"),
])
def test_fault_flags_out_of_range_or_without_their_switch_fail(base, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + extra)
