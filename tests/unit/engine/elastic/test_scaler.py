"""FleetScaler over an EngineFleet of in-process engines (elastic_fakes): scale-out gives new engines the
fleet's weights before they are routed to; scale-in drains (requests finish, or are evicted and re-sent
at the drain timeout); startup engines are protected; the partial-success policies; cancellation rolls
back; operations are exclusive and idempotent; fleet-wide calls skip a draining engine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from elastic_fakes import Behaviour, install, run, started_fleet

from relax.engine.elastic.local_ops import LocalFleetOps
from relax.engine.elastic.operations import Conflict, ScalingError
from relax.engine.elastic.scaler import FleetScaler, ScalerSettings
from relax.utils.http_utils import post

TRAINER_VERSION = 7


@pytest.fixture()
def env(monkeypatch, tmp_path):
    return install(monkeypatch, tmp_path)


def scaler_over(fleet, routed_at_sync=None, **settings) -> FleetScaler:
    """A scaler whose weight sync sets the new engines to the trainer's version (noting what the router
    routed to meanwhile)."""
    async def sync(urls):
        if routed_at_sync is not None:
            routed_at_sync.append(list(fleet.router.engine_urls))
        for url in urls:
            await post(url + "/update_weight_version", {"new_version": str(TRAINER_VERSION)})
        return TRAINER_VERSION

    return FleetScaler(LocalFleetOps(fleet, sync, partial_rollout=settings.pop("partial", False)),
                       ScalerSettings(**settings))


async def finish(op):
    await asyncio.wait_for(asyncio.shield(op.task), 30)
    return op


def test_scale_out_engines_get_the_fleets_weights_before_they_join_the_router(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        for name in ("new0", "new1"):
            await pool.serve(Behaviour(name, version=0))
        routed_at_sync: list = []
        scaler = scaler_over(fleet, routed_at_sync)
        op = await finish((await scaler.scale_out({"num_engines": 2}))[0])
        replies = {(await post(fleet.router_url + "/generate", {}))["text"] for _ in range(6)}
        table, version = fleet.table(), await fleet.weight_version()
        await fleet.stop()
        return op, routed_at_sync, replies, table, version

    op, routed_at_sync, replies, table, version = run(pool, main)
    assert op.status == "succeeded" and len(op.added) == 2
    assert routed_at_sync == [[pool.launched[0].url]]  # while they got weights, only the old engine took requests
    assert replies == {"start0", "new0", "new1"} and version == TRAINER_VERSION
    assert [(e["id"], e["state"], e["protected"]) for e in table] == [
        ("engine-0", "active", True), ("engine-1", "active", False), ("engine-2", "active", False)]


def test_scale_in_drains_the_newest_unprotected_engines_and_stops_them(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        for name in ("new0", "new1"):
            await pool.serve(Behaviour(name))
        scaler = scaler_over(fleet)
        await finish((await scaler.scale_out({"target_engines": 3}))[0])
        op = await finish((await scaler.scale_in({"target_engines": 1}))[0])
        urls = fleet.urls
        await fleet.stop()
        return op, urls, scaler.stats

    op, urls, stats = run(pool, main)
    assert op.status == "succeeded" and op.removed == [pool.launched[2].url, pool.launched[1].url]
    assert urls == [pool.launched[0].url] and pool.launched[1].terminated and pool.launched[2].terminated
    assert stats["engines_added"] == 2 and stats["engines_removed"] == 2 and stats["operations_succeeded"] == 2


@pytest.mark.parametrize("partial", [False, True])
def test_a_hung_engine_is_evicted_at_the_drain_timeout_and_its_requests_resent(env, partial):
    """Without partial rollout the router re-sends each request whole to another engine; with it the
    engine aborts them (each reply carries finish_reason abort and its tokens: the rollout resumes it)."""
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        hung = Behaviour("hung", hang=True)
        await pool.serve(hung)
        scaler = scaler_over(fleet, drain_timeout=0.5, partial=partial)
        await finish((await scaler.scale_out({"num_engines": 1}))[0])
        requests = [asyncio.ensure_future(post(fleet.router_url + "/generate", {"i": i})) for i in range(4)]
        while fleet.router.served < 4 or not fleet.in_flight_at(pool.launched[1].url):
            await asyncio.sleep(0.01)
        stuck = fleet.in_flight_at(pool.launched[1].url)
        start = time.monotonic()
        op = await finish((await scaler.scale_in({"engines": ["engine-1"]}))[0])
        replies = [r["text"] for r in await asyncio.gather(*requests)]
        resent = fleet.router.drain_resent
        await fleet.stop()
        return op, time.monotonic() - start, replies, hung, resent, stuck

    op, took, replies, hung, resent, stuck = run(pool, main)
    assert op.status == "succeeded" and op.requests_resent == stuck >= 1 and took < 5
    if partial:  # each aborted request came back from the hung engine, to be resumed by the rollout
        assert hung.aborted == 1 and replies.count("hung") == stuck and resent == 0
    else:  # each request got exactly one reply, from the other engine
        assert replies == ["start0"] * 4 and resent == stuck


def test_startup_engines_are_protected(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [0, 0])
        scaler = scaler_over(fleet)
        errors = []
        for request in ({"num_engines": 1}, {"engines": ["engine-1"]}, {"engines": ["engine-9"]}):
            with pytest.raises(ScalingError) as err:
                await scaler.scale_in(request)
            errors.append((err.value.status, err.value.message))
        await fleet.stop()
        return errors

    (s1, m1), (s2, m2), (s3, m3) = run(pool, main)
    assert s1 == 409 and "only 0 engine(s) can be scaled in" in m1 and "protected" in m1
    assert s2 == 409 and "['engine-1'] are protected" in m2
    assert s3 == 404 and "no engine ['engine-9']" in m3


@pytest.mark.parametrize("policy", ["rollback_all", "keep_partial"])
def test_partial_success_policy_with_one_engine_that_fails_to_start(env, policy):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        await pool.serve(Behaviour("good"))
        await pool.serve(Behaviour("broken", fail_start=True))
        scaler = scaler_over(fleet, partial_success_policy=policy)
        op = await finish((await scaler.scale_out({"num_engines": 2}))[0])
        urls = fleet.urls
        await fleet.stop()
        return op, urls

    op, urls = run(pool, main)
    good, broken = pool.launched[1], pool.launched[2]
    assert broken.terminated and any("broken exited with code 1" in e["message"] for e in op.events)
    if policy == "rollback_all":
        assert op.status == "failed" and "keeps none" in op.error and good.terminated
        assert urls == [pool.launched[0].url]
    else:
        assert op.status == "partial" and op.added == [good.url] and urls == [pool.launched[0].url, good.url]


def test_cancel_mid_scale_out_restores_the_previous_fleet(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        await pool.serve(Behaviour("fast"))
        await pool.serve(Behaviour("slow", slow_start=threading.Event()))
        scaler = scaler_over(fleet)
        op, _ = await scaler.scale_out({"num_engines": 2})
        while len(fleet.urls) < 2:  # the fast one joined, the slow one still starts
            await asyncio.sleep(0.01)
        scaler.cancel(op.id)
        await asyncio.wait([op.task])
        with pytest.raises(ScalingError, match="already ended"):
            scaler.cancel(op.id)
        urls, routed = fleet.urls, list(fleet.router.engine_urls)
        await fleet.stop()
        return op, urls, routed

    op, urls, routed = run(pool, main)
    assert op.status == "cancelled" and "rolled back" in op.events[-1]["message"]
    assert urls == routed == [pool.launched[0].url] and all(e.terminated for e in pool.launched[1:])


def test_cancel_during_drain_routes_to_the_engine_again(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        await pool.serve(Behaviour("hung", hang=True))
        scaler = scaler_over(fleet, drain_timeout=60)
        await finish((await scaler.scale_out({"num_engines": 1}))[0])
        request = asyncio.ensure_future(post(fleet.router_url + "/generate", {}))
        request2 = asyncio.ensure_future(post(fleet.router_url + "/generate", {}))
        while fleet.in_flight_at(pool.launched[1].url) < 1:
            await asyncio.sleep(0.01)
        op, _ = await scaler.scale_in({"num_engines": 1})
        while op.phase != "draining" or "draining" not in [e["state"] for e in fleet.table()]:
            await asyncio.sleep(0.01)
        scaler.cancel(op.id)
        await asyncio.wait([op.task])
        table = fleet.table()
        await post(pool.launched[1].url + "/abort_request", {})
        await asyncio.gather(request, request2)
        await fleet.stop()
        return op, table

    op, table = run(pool, main)
    assert op.status == "cancelled" and op.removed == []
    assert [e["state"] for e in table] == ["active", "active"]


def test_operations_are_exclusive_and_idempotent(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        gate = threading.Event()
        await pool.serve(Behaviour("slow", slow_start=gate))
        scaler = scaler_over(fleet)
        op, new = await scaler.scale_out({"num_engines": 1}, key="k1")
        again, new_again = await scaler.scale_out({"num_engines": 1}, key="k1")
        with pytest.raises(Conflict) as conflict:
            await scaler.scale_out({"num_engines": 1}, key="k2")
        with pytest.raises(ScalingError) as reused:
            await scaler.scale_out({"num_engines": 3}, key="k1")
        gate.set()
        await finish(op)
        after, new_after = await scaler.scale_out({"num_engines": 1}, key="k1")  # done: still the same one
        await fleet.stop()
        return op, new, again, new_again, conflict.value, reused.value, after, new_after, len(fleet.urls)

    op, new, again, new_again, conflict, reused, after, new_after, _ = run(pool, main)
    assert new and again is op and not new_again and after is op and not new_after
    assert conflict.status == 409 and conflict.body()["running_operation"] == op.id
    assert reused.status == 422 and op.status == "succeeded" and len(pool.launched) == 2


def test_fleet_calls_and_weight_versions_skip_a_draining_engine(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [5, 5])
        await pool.serve(Behaviour("old", version=1))
        scaler = FleetScaler(LocalFleetOps(fleet), ScalerSettings())
        op = await finish((await scaler.scale_out({"num_engines": 1}))[0])
        fleet.drain(fleet.urls[1])
        reached = await fleet.each_by_engine(lambda c: c.get_weight_version())
        await fleet.stop()
        return op, reached

    op, reached = run(pool, main)
    assert op.status == "failed" and "holds weight version 1, the fleet 5" in op.error
    assert list(reached) == [pool.launched[0].url] and pool.launched[2].terminated  # the stale one never joined


def test_an_external_engine_joins_with_the_fleets_weights_and_is_released_not_stopped(env):
    """(With a real hf engine in a real run: tests/integration/test_elastic.py.)"""
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        outside = Behaviour("outside", version=0)
        address = await pool.serve(outside, queue=False)
        scaler = scaler_over(fleet)
        up = await finish((await scaler.scale_out({"addresses": [address]}))[0])
        table = fleet.table()
        with pytest.raises(ScalingError) as again:  # already in the fleet
            await scaler.scale_out({"addresses": [address]})
        down = await finish((await scaler.scale_in({"engines": ["external-0"]}))[0])
        alive = (await post(address + "/generate", {}))["text"]
        await fleet.stop()
        return up, table, again, down, alive, outside

    up, table, again, down, alive, outside = run(pool, main)
    assert up.status == "succeeded" and up.kind == "register" and outside.version == TRAINER_VERSION
    assert [(e["id"], e["external"], e["protected"]) for e in table] == [("engine-0", False, True),
                                                                        ("external-0", True, False)]
    assert again.value.status == 409 and "already serve in the fleet" in again.value.message
    assert down.status == "succeeded" and down.removed == [up.added[0]] and alive == "outside"


def test_an_engine_not_healthy_within_the_scale_out_timeout_fails_the_operation(env):
    pool, spec = env

    async def main():
        fleet = await started_fleet(pool, spec, [TRAINER_VERSION])
        await pool.serve(Behaviour("stuck", slow_start=threading.Event()))
        scaler = scaler_over(fleet, scale_out_timeout=0.3)
        start = time.monotonic()
        op = await finish((await scaler.scale_out({"num_engines": 1}))[0])
        urls = fleet.urls
        await fleet.stop()
        return op, time.monotonic() - start, urls

    op, took, urls = run(pool, main)
    assert op.status == "failed" and took < 5 and urls == [pool.launched[0].url] and pool.launched[1].terminated
    assert any("not healthy after 0.3s" in e["message"] for e in op.events)
