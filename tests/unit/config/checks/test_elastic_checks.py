"""The elastic-scaling flags (`relax.config.elastic`, `relax.config.checks.elastic`): the seed's names,
types and defaults, their ranges, and the autoscaler YAML checked before Ray starts."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config


def test_the_seed_flags_parse_with_their_defaults(base):
    e = parse_config(base).elastic
    assert (e.autoscaler_config, e.scale_out_timeout, e.scale_out_partial_success_policy, e.scale_in_drain_timeout,
            e.scale_in_shutdown_timeout) == (None, 300.0, "rollback_all", 30.0, 30.0)
    assert (e.scale_api, e.scale_api_host, e.scale_api_port) == (True, "127.0.0.1", 0)
    e = parse_config(base + ["--scale-out-timeout", "5", "--scale-out-partial-success-policy", "keep_partial",
                             "--scale-in-drain-timeout", "1.5", "--scale-in-shutdown-timeout", "2",
                             "--scale-api", "false"]).elastic
    assert (e.scale_out_timeout, e.scale_out_partial_success_policy, e.scale_in_drain_timeout,
            e.scale_in_shutdown_timeout, e.scale_api) == (5.0, "keep_partial", 1.5, 2.0, False)


@pytest.mark.parametrize("extra, needle", [
    (["--scale-out-timeout", "0"], "--scale-out-timeout must be > 0 seconds"),
    (["--scale-in-drain-timeout", "-1"], "--scale-in-drain-timeout must be > 0 seconds"),
    (["--scale-api-port", "70000"], "--scale-api-port must be 0"),
    (["--autoscaler-config", "/nonexistent.yaml"], "--autoscaler-config /nonexistent.yaml: cannot read it"),
])
def test_elastic_flags_out_of_range_fail(base, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + extra)


def test_a_wrong_autoscaler_yaml_fails_naming_the_key(base, tmp_path):
    path = tmp_path / "autoscaler.yaml"
    path.write_text("min_engines: 1\nmax_engines: 2\ncooldown: 5\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['cooldown'\]"):
        parse_config(base + ["--autoscaler-config", str(path)])
    path.write_text("min_engines: 1\nmax_engines: 2\ncooldown_s: 5\n")
    assert parse_config(base + ["--autoscaler-config", str(path)]).elastic.autoscaler_config == str(path)
