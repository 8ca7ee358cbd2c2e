"""The autoscaler: its pure decision rule (bounds, cooldown, thresholds, step size, busy engines, protected
engines), its YAML checks, and its loop acting through a scaler of in-process engines: it grows a fleet
whose trainer waits on rollout and shrinks an idle one, within its bounds and cooldown, each decision an
event with its reason."""

from __future__ import annotations

import asyncio

import pytest
from elastic_fakes import Behaviour, install, started_fleet

from relax.config.autoscaler import AutoscalerConfig, autoscaler_config, load_autoscaler_config
from relax.engine.elastic.autoscaler import Autoscaler, Signals, decide
from relax.engine.elastic.local_ops import LocalFleetOps
from relax.engine.elastic.scaler import FleetScaler, ScalerSettings
from relax.utils.http_utils import close_sessions

CFG = AutoscalerConfig(min_engines=1, max_engines=4, target_metric="trainer_wait", scale_out_threshold=0.3,
                       scale_in_threshold=0.05, cooldown_s=60, step_size=2, idle_utilization=0.5)


def signals(engines=2, removable=1, **kw) -> Signals:
    return Signals(engines=engines, removable=removable, **kw)


@pytest.mark.parametrize("s, last, want", [
    (signals(trainer_wait=0.6), None, ("scale_out", 2)),  # the trainer starves: grow by step_size
    (signals(engines=3, trainer_wait=0.6), None, ("scale_out", 1)),  # ... up to max_engines
    (signals(engines=4, trainer_wait=0.9), None, ("hold", 0)),  # at max_engines
    (signals(trainer_wait=0.6), 1000 - 30, ("hold", 0)),  # cooldown: the last change was 30 s ago
    (signals(trainer_wait=0.6), 1000 - 61, ("scale_out", 2)),  # cooldown over
    (signals(trainer_wait=0.01, utilization=0.1), None, ("scale_in", 1)),  # idle: shrink (one removable)
    (signals(engines=4, removable=3, trainer_wait=0.01), None, ("scale_in", 2)),
    (signals(trainer_wait=0.01, utilization=0.9), None, ("hold", 0)),  # busy engines: throughput first
    (signals(engines=1, removable=0, trainer_wait=0.0), None, ("hold", 0)),  # min_engines
    (signals(removable=0, trainer_wait=0.0), None, ("hold", 0)),  # only protected engines left
    (signals(trainer_wait=0.2), None, ("hold", 0)),  # within the thresholds
    (signals(), None, ("hold", 0)),  # nothing measured yet
    (signals(engines=0, removable=0), 1000 - 1, ("scale_out", 1)),  # below min_engines, cooldown or not
    (signals(engines=6, removable=5), 1000 - 1, ("scale_in", 2)),  # above max_engines
    (signals(busy=True, trainer_wait=0.9), None, ("hold", 0)),  # an operation runs
])
def test_the_decision_rule(s, last, want):
    decision = decide(CFG, s, now=1000.0, last_change=last)
    assert (decision.action, decision.count) == want, decision.reason
    assert decision.reason


def test_the_yaml_is_checked_naming_the_key(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("min_engines: 2\nmax_engines: 5\ntarget_metric: queue_depth\nscale_out_threshold: 4\n"
                    "scale_in_threshold: 1\ncooldown_s: 5\n")
    assert load_autoscaler_config(str(path)) == AutoscalerConfig(min_engines=2, max_engines=5, target_metric=
                                                                 "queue_depth", scale_out_threshold=4.0,
                                                                 scale_in_threshold=1.0, cooldown_s=5.0)
    for values, words in (({"max_engine": 3}, "unknown key(s) ['max_engine']"),
                          ({"min_engines": "2"}, "min_engines must be int"),
                          ({"min_engines": 3, "max_engines": 2}, "max_engines (2) must be >= min_engines (3)"),
                          ({"target_metric": "vibes"}, "target_metric 'vibes' is not one of"),
                          ({"scale_in_threshold": 0.5, "scale_out_threshold": 0.4}, "must be below")):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            autoscaler_config(values)
    (tmp_path / "b.yaml").write_text("min_engines: [1\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_autoscaler_config(str(tmp_path / "b.yaml"))


def test_the_autoscaler_grows_a_starving_fleet_and_shrinks_an_idle_one_within_bounds_and_cooldown(monkeypatch,
                                                                                                   tmp_path):
    pool, spec = install(monkeypatch, tmp_path)
    cfg = AutoscalerConfig(min_engines=1, max_engines=3, scale_out_threshold=0.3, scale_in_threshold=0.05,
                           cooldown_s=10, step_size=1)
    clock = [0.0]
    wait = [0.8]  # the trainer's wait for samples: starving, then idle

    async def main():
        fleet = await started_fleet(pool, spec, [0])
        for i in range(3):
            await pool.serve(Behaviour(f"new{i}"))
        scaler = FleetScaler(LocalFleetOps(fleet), ScalerSettings())

        async def measured() -> Signals:
            table = fleet.table()
            active = [e for e in table if e["state"] == "active"]
            return Signals(engines=len(active), removable=sum(not e["protected"] for e in active),
                           busy=scaler.book.running is not None, trainer_wait=wait[0])

        events: list[dict] = []
        auto = Autoscaler(cfg, scaler, measured, sink=events.append, clock=lambda: clock[0])
        sizes = []
        for t, w in ((0, .8), (1, .8), (12, .8), (24, .8), (36, .8), (48, .01), (50, .01), (62, .01), (74, .01),
                     (86, .01)):
            clock[0], wait[0] = float(t), w
            await auto.step()
            while scaler.book.running is not None:
                await asyncio.sleep(0.01)
            sizes.append(len(fleet.urls))
        await fleet.stop()
        await close_sessions()
        await pool.close()
        return sizes, events

    sizes, events = asyncio.run(main())
    assert sizes == [2, 2, 3, 3, 3, 2, 2, 1, 1, 1]  # +1, cooldown, +1, max, max, -1, cooldown, -1, min, min
    assert [e["action"] for e in events] == ["scale_out", "hold", "scale_out", "hold", "hold", "scale_in", "hold",
                                             "scale_in", "hold", "hold"]
    assert "cooldown" in events[1]["reason"] and "max_engines 3" in events[3]["reason"]
    assert "trainer_wait 0.01 < scale_in_threshold" in events[5]["reason"] and events[5]["operation"]
    assert events[0]["signals"]["trainer_wait"] == 0.8


def test_the_example_config_loads():
    from pathlib import Path

    example = Path(__file__).resolve().parents[4] / "configs" / "autoscaler.yaml"
    assert load_autoscaler_config(str(example)).idle_utilization == 0.5


def test_a_steps_metrics_give_the_trainers_wait_samples_per_second_and_staleness_headroom():
    from relax.engine.elastic.autoscaler import step_signals

    fully_async = {"time/step": 4.0, "time/trainer_wait": 1.0, "time/rollout": 3.0, "rollout/num_samples": 16.0,
                   "rollout/started_at_version": 4.0}
    assert step_signals(5, fully_async, max_staleness=2) == {"trainer_wait": 0.25, "samples_per_second": 4.0,
                                                             "staleness_headroom": 1.0}
    colocate = {"time/step": 4.0, "time/rollout": 3.0, "rollout/num_samples": 16.0}
    assert step_signals(5, colocate, max_staleness=None) == {"trainer_wait": 0.75, "samples_per_second": 4.0}
    assert step_signals(0, {}, max_staleness=None) == {}
