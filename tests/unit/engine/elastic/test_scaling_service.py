"""The run's scaling service (`relax.engine.elastic.service`), as the Rollout hosts it, over a fleet of
in-process engines, with the run's weights side (`run_ops.Weights`) stood in: the API is published in the
run directory; a new engine joins the coordinator's topology and gets the Actor's weights before it is
routed to, a drained one leaves the topology at once and is stopped only after the pushes settled; the
step metrics count the operations and draw them on the timeline's `scaling` track; stopping rolls an
operation in flight back and unpublishes the API."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from elastic_fakes import Behaviour, install, run, started_fleet

from relax.config.schema import RelaxConfig
from relax.distributed.checkpoint_service.coordinator import Receivers
from relax.engine.elastic import discovery
from relax.engine.elastic.local_ops import LocalFleetOps
from relax.engine.elastic.operations import Operation
from relax.engine.elastic.run_ops import RunFleetOps
from relax.engine.elastic.service import NoScaling, ScalingService, draw
from relax.utils.http_utils import post
from relax.utils.timeline import Timeline

ACTOR_VERSION = 5


class StandInWeights:
    """What the Actor and the DCS coordinator would do, recorded: the topologies registered, the engines
    given the weights (set to ACTOR_VERSION), the settles."""

    def __init__(self, log: list[tuple]) -> None:
        self.log = log

    async def register(self, receivers: Receivers) -> None:
        self.log.append(("register", list(receivers.endpoints)))

    async def restore(self, urls: list[str], devices: list) -> int:
        for url in urls:
            await post(url + "/update_weight_version", {"new_version": str(ACTOR_VERSION)})
        self.log.append(("restore", list(urls)))
        return ACTOR_VERSION

    async def settle(self) -> None:
        self.log.append(("settle",))


@pytest.fixture()
def env(monkeypatch, tmp_path):
    return install(monkeypatch, tmp_path)


def service_over(fleet, tmp_path, log: list[tuple]) -> ScalingService:
    cfg = RelaxConfig().replace(exp_dir=str(tmp_path), timeline_dump_dir=str(tmp_path / "timeline"),
                                scale_in_drain_timeout=1.0, scale_in_shutdown_timeout=1.0)
    receivers = lambda: Receivers([u for u in fleet.urls if u not in fleet.draining])  # noqa: E731
    ops = RunFleetOps(LocalFleetOps(fleet), StandInWeights(log), receivers)
    return ScalingService(cfg, ops, asyncio.Lock(), max_staleness=None)


def timeline_events(tmp_path) -> list[dict]:
    return [json.loads(line) for f in (tmp_path / "timeline").glob("scaling.*.jsonl")
            for line in f.read_text().splitlines()]


def test_the_service_scales_with_the_runs_weights_and_counts_each_step(env, tmp_path):
    pool, spec = env
    log: list[tuple] = []

    async def main():
        fleet = await started_fleet(pool, spec, [ACTOR_VERSION])
        await pool.serve(Behaviour("added"))
        service = service_over(fleet, tmp_path, log)
        url = await service.start()
        published = discovery.find(str(tmp_path))
        op, _ = await service.scaler.scale_out({"num_engines": 1})
        await asyncio.wait([op.task])
        log.append(("routed", list(fleet.router.engine_urls)))
        grown = await service.step_metrics(0, {})
        op, _ = await service.scaler.scale_in({"num_engines": 1})
        await asyncio.wait([op.task])
        shrunk = await service.step_metrics(1, {})
        await service.stop()
        await service.stop()  # (idempotent: Controller, then the Rollout's shutdown)
        await fleet.stop()
        return url, published, grown, shrunk

    url, published, grown, shrunk = run(pool, main)
    first, added = pool.launched[0].url, pool.launched[1].url
    assert published[0] == url and not (tmp_path / ".relax" / "scale_api.json").exists()  # unpublished at stop
    assert log == [("register", [first, added]), ("restore", [added]), ("routed", [first, added]),
                   ("register", [first]), ("settle",)]  # joins with the weights; leaves the topology, then stops
    assert (grown["elastic/engines"], grown["elastic/operations"], grown["elastic/engines_added"]) == (2, 1, 1)
    assert (shrunk["elastic/engines"], shrunk["elastic/operations"], shrunk["elastic/engines_removed"]) == (1, 1, 1)
    assert [e["name"] for e in timeline_events(tmp_path)] == [
        "scale_out (succeeded)", f"engine joins: {added}", "scale_in (succeeded)", f"engine leaves: {added}"]


def test_stopping_rolls_back_an_operation_in_flight(env, tmp_path):
    pool, spec = env
    log: list[tuple] = []

    async def main():
        fleet = await started_fleet(pool, spec, [ACTOR_VERSION])
        await pool.serve(Behaviour("slow", slow_start=threading.Event()))
        service = service_over(fleet, tmp_path, log)
        await service.start()
        op, _ = await service.scaler.scale_out({"num_engines": 1})
        while op.phase != "launching":
            await asyncio.sleep(0.01)
        await service.stop()
        urls = fleet.urls
        await fleet.stop()
        return op, urls

    op, urls = run(pool, main)
    assert op.status == "cancelled" and urls == [pool.launched[0].url] and pool.launched[1].terminated
    assert not (tmp_path / ".relax" / "scale_token").exists()


def test_a_rollout_without_scaling_counts_nothing():
    async def main():
        scaling = NoScaling()
        await scaling.stop()
        return await scaling.step_metrics(3, {"time/step": 1.0})

    assert asyncio.run(main()) == {}


def test_an_operation_and_its_engines_are_drawn_on_the_timeline(tmp_path):
    timeline = Timeline(str(tmp_path / "timeline"), "scaling")
    op = Operation(id="op-1", kind="scale_out", request={"num_engines": 1}, status="succeeded", created=100.0,
                   finished=112.5, added=["http://127.0.0.1:1"])
    draw(timeline, op)
    events = timeline_events(tmp_path)
    assert [(e["name"], e["dur"]) for e in events] == [("scale_out (succeeded)", 12_500_000),
                                                      ("engine joins: http://127.0.0.1:1", 1000)]
    assert all(e["args"]["op"] == "op-1" for e in events)
