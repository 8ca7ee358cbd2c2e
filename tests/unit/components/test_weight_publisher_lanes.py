"""Which weight lanes a push goes to (`relax.components.weight_publisher.due_lanes`), and
--update-weights-interval: the engines' lane every N-th version, the first push always, the
Reference's lane on its own cadence; the plan lets rows lag N - 1 versions."""

from __future__ import annotations

import pytest

from relax.components.weight_publisher import due_lanes
from relax.config import ConfigError, parse_config
from relax.config.checks.backends import check_update_interval
from relax.config.plan import format_plan, resolve_plan


def pushed_versions(lanes: list[int], interval: int, versions: range) -> dict[int, list[int]]:
    return {v: due_lanes(lanes, v, interval, first=v == versions.start) for v in versions}


def test_every_version_goes_to_the_engines_by_default():
    assert all(lanes == [1] for lanes in pushed_versions([1], 1, range(0, 5)).values())


def test_an_interval_skips_the_engines_between_its_versions():
    got = pushed_versions([1], 3, range(0, 7))
    assert [v for v, lanes in got.items() if lanes] == [0, 3, 6]


def test_the_first_push_always_goes_and_other_lanes_keep_their_cadence():
    got = pushed_versions([1, 2], 3, range(5, 10))  # resumed at version 5; a reference refreshed every 2
    assert got == {5: [1], 6: [1, 2], 7: [], 8: [2], 9: [1]}


def test_the_plan_lets_rows_lag_and_says_when_the_engines_take_weights(base):
    cfg = parse_config(base + ["--update-weights-interval", "3"])
    plan = resolve_plan(cfg)
    assert plan.actor.max_staleness == 2 and plan.actor.engine_push_every == 3
    assert "after every 3 steps" in format_plan(plan, cfg)
    assert resolve_plan(parse_config(base)).actor.max_staleness == 0


def test_sglang_colocate_needs_the_engines_to_keep_their_weights(base):
    cfg = parse_config(base + ["--update-weights-interval", "2"]).replace(rollout_backend="sglang")
    with pytest.raises(ConfigError, match="add --no-offload-rollout"):
        check_update_interval(cfg)
    check_update_interval(cfg.replace(offload_rollout=False))
    with pytest.raises(ConfigError, match="--max-staleness bounds how far"):
        parse_config(base + ["--fully-async", "--update-weights-interval", "2"])
