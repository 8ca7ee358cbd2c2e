"""Plugin flags name importable callables of the right signature (`relax.config.checks.plugins`;
every plugin point's contract: tests/contracts/test_plugin_signatures.py)."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config


@pytest.mark.parametrize("extra, needle", [
    (["--custom-rm-path", "no_such_module.fn"], "--custom-rm-path"),
    (["--custom-rm-path", "json.dumps"], "reward_func(args, sample"),
])
def test_bad_combinations_fail_naming_the_flag(base, extra, needle):
    with pytest.raises((ConfigError, SystemExit)) as err:
        parse_config(base + extra)
    if err.type is ConfigError:
        assert needle in str(err.value)
