"""Numeric flags in their ranges (`relax.config.checks.ranges`): the message gives the range,
what the number means and the value."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config
from relax.config.checks.ranges import RANGES
from relax.config.schema import FIELD_GROUP


@pytest.mark.parametrize("extra, message", [
    (["--lr", "-1"], "--lr must be > 0 (a learning rate), got -1.0"),
    (["--gamma", "1.5"], "--gamma must be >= 0 and <= 1 (a discount), got 1.5"),
    (["--adam-beta2", "1"], "--adam-beta2 must be >= 0 and < 1 (a moment decay), got 1.0"),
    (["--eval-interval", "0"], "--eval-interval must be >= 1 (a step interval), got 0"),
])
def test_a_value_out_of_range_names_the_flag_the_range_and_the_value(base, extra, message):
    with pytest.raises(ConfigError) as err:
        parse_config(base + extra)
    assert str(err.value) == message


def test_every_ranged_name_is_a_flag():
    assert set(RANGES) <= set(FIELD_GROUP)
