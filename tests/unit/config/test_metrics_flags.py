"""--use-wandb / --use-clearml / --use-metrics-service: accepted, a missing package is a clear
error naming the flag and the install command, and the metrics role is planned first."""

from __future__ import annotations

import sys

import pytest

from relax.config import ConfigError, parse_config
from relax.config.plan import format_plan, resolve_plan


def test_the_metrics_flags_are_accepted(base):
    pytest.importorskip("wandb")
    pytest.importorskip("clearml")
    log = parse_config(base + ["--use-wandb", "--use-clearml", "--use-metrics-service"]).logging
    assert log.use_wandb and log.use_clearml and log.use_metrics_service


@pytest.mark.parametrize("flag, package", [("--use-wandb", "wandb"), ("--use-clearml", "clearml")])
def test_a_missing_sink_package_names_the_flag_and_the_install_command(base, monkeypatch, flag, package):
    monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed
    with pytest.raises(ConfigError) as err:
        parse_config(base + [flag])
    assert f"{flag} needs the '{package}' package" in str(err.value)
    assert f"pip install 'relax-rl[{package}]'" in str(err.value)


def test_the_metrics_service_is_planned_first_and_only_with_its_flag(base):
    assert "metrics" not in [r.name for r in resolve_plan(parse_config(base)).roles]
    plan = resolve_plan(parse_config(base + ["--use-metrics-service"]))
    assert [r.name for r in plan.roles] == ["metrics", "actor", "rollout", "dcs"]
    assert plan.role("metrics").workers == 0
    assert "metrics service" in format_plan(plan)
