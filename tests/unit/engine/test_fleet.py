"""EngineFleet: launch side by side, a failed start stops what it launched, engines join and leave
the running router, and fleet-wide calls reach every engine.

The engines are small aiohttp servers speaking the few SGLang endpoints the fleet calls; the
launch function is registered as a fake inference backend (a stand-in for `hf`/`sglang`)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from relax.backends import registry
from relax.engine.fleet import EngineFleet, FleetSpec
from relax.utils.http_utils import close_sessions, post

SERVERS: list[tuple[str, int]] = []  # (url, weight version) of the next engines to hand out
LAUNCHED: list["FakeEngine"] = []


class FakeEngine:
    def __init__(self, url: str, fail: bool = False) -> None:
        self.url, self.fail, self.terminated = url, fail, False

    def wait_ready(self, timeout: float) -> None:
        if self.fail:
            raise RuntimeError(f"engine at {self.url} exited with code 1 before becoming ready")

    def alive(self) -> bool:
        return not self.terminated

    def terminate(self, timeout: float = 10.0) -> None:
        self.terminated = True

    def describe(self) -> str:
        return f"fake engine at {self.url} exited with code 7; log /logs/fake.log, ending:\nCUDA error: boom"


def fake_launch(model_path, *, api_key=None, num_threads=None, log_path=None, options=None, device="cpu"):
    url, version = SERVERS.pop(0)
    engine = FakeEngine(url, fail=version < 0)
    engine.device, engine.log_path = device, log_path
    LAUNCHED.append(engine)
    return engine


async def serve(version: int, name: str, hung: asyncio.Event | None = None) -> web.AppRunner:
    """An engine answering as `name` at weight `version`; with `hung`, silent until the event is set."""
    async def generate(request):
        return web.json_response({"text": name})

    async def health(request):
        if hung is not None:
            await hung.wait()
        return web.Response()

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/model_info", lambda r: web.json_response({"weight_version": str(version)}))
    app.router.add_get("/server_info", lambda r: web.json_response({"busy_seconds": version * 1.5}))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    SERVERS.append((f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", version))
    return runner


@pytest.fixture()
def spec(monkeypatch, tmp_path):
    SERVERS.clear(), LAUNCHED.clear()
    monkeypatch.setitem(registry.INFERENCE_BACKENDS, "fake", f"{__name__}.fake_launch")
    return FleetSpec(name="rollout", backend="fake", model_path="/m", log_dir=str(tmp_path))


def test_engines_join_and_leave_the_fleet_and_its_router(spec):
    async def main():
        runners = [await serve(v, f"e{v}") for v in (3, 5, 4)]
        fleet = EngineFleet(spec)
        await fleet.start(2)
        first = await fleet.weight_version(), await fleet.busy_seconds()
        added = await fleet.add()
        replies = {(await post(fleet.router_url + "/generate", {}))["text"] for _ in range(6)}
        await fleet.remove(LAUNCHED[0].url)
        after_remove = await fleet.weight_version(), fleet.urls
        await fleet.stop()
        await close_sessions()
        for r in runners:
            await r.cleanup()
        return first, added, replies, after_remove

    (version, busy), added, replies, (version_after, urls) = asyncio.run(main())
    assert version == 3 and list(busy.values()) == [4.5, 7.5]  # the oldest version any engine holds; per engine
    assert replies == {"e3", "e5", "e4"}  # the added engine serves through the same router
    assert added == LAUNCHED[2].url and version_after == 4 and urls == [LAUNCHED[1].url, LAUNCHED[2].url]
    assert LAUNCHED[0].terminated and all(e.terminated for e in LAUNCHED)  # removed, then stopped


def test_a_failed_start_stops_every_engine_it_launched_and_raises(spec):
    async def main():
        runners = [await serve(1, "ok"), await serve(-1, "broken")]
        fleet = EngineFleet(spec)
        try:
            with pytest.raises(RuntimeError, match="exited with code 1 before becoming ready"):
                await fleet.start(2)
        finally:
            for r in runners:
                await r.cleanup()
        return fleet

    fleet = asyncio.run(main())
    assert all(e.terminated for e in LAUNCHED) and fleet.engines == [] and fleet.router is None


def test_a_bad_engine_option_names_the_fleet(spec):
    import dataclasses

    bad = dataclasses.replace(spec, backend="hf", options={"bogus": 1})
    with pytest.raises(ValueError, match="rollout engine options: unknown engine option 'bogus'"):
        asyncio.run(EngineFleet(bad).start(1))


def test_an_engine_that_stops_answering_is_named_with_its_state_and_log(spec):
    """A fleet call and a routed generate that reach a dead engine say which engine, how it ended
    and the end of its log (EngineHandle.describe), not only a connection error."""
    from relax.distributed.engine_client import EngineError

    async def main():
        runner = await serve(1, "e1")
        fleet = EngineFleet(spec)
        await fleet.start(1)
        await runner.cleanup()  # the engine is gone: connections are refused
        try:
            with pytest.raises(EngineError) as err:
                await fleet.each(lambda c: c.get_weight_version())
            routed = None
            try:
                await post(fleet.router_url + "/generate", {})
            except Exception as exc:  # noqa: BLE001 - the router's 502 comes back as HTTPError
                routed = exc
        finally:
            await fleet.stop()
            await close_sessions()
        return str(err.value), routed

    message, routed = asyncio.run(main())
    assert "no reply" in message and "ClientConnectorError" in message and "(after 4 attempts)" in message
    assert "rollout fake engine at" in message and "exited with code 7" in message and "CUDA error: boom" in message
    assert routed is not None and routed.status == 502
    assert "unreachable" in routed.body and "exited with code 7" in routed.body and "CUDA error: boom" in routed.body


def test_a_dead_and_a_hung_engine_are_found_and_replaced_on_their_devices(spec):
    """`probe` names the engine that died and the one that does not answer /health; `replace` stops each
    and starts a fresh one on its device, in the fleet but routed to only once admitted."""
    import dataclasses

    async def main():
        hung = asyncio.Event()
        runners = [await serve(0, "dead"), await serve(0, "hung", hung), await serve(0, "fresh0"),
                   await serve(0, "fresh1")]
        fleet = EngineFleet(dataclasses.replace(spec, devices=("cuda:0", "cuda:1"), hold_s=5.0,
                                                log_names=("engine_0.log", "engine_1.log")))
        await fleet.start(2)
        dead, stuck = LAUNCHED[0], LAUNCHED[1]
        dead.terminated = True  # its process is gone
        found = dict(await fleet.probe(timeout=0.5))
        fresh = [await fleet.replace(dead.url), await fleet.replace(stuck.url)]
        routed_before = list(fleet.router.engine_urls)
        for url in fresh:
            await fleet.admit(url)
        replies = {(await post(fleet.router_url + "/generate", {}))["text"] for _ in range(4)}
        hung.set()
        await fleet.stop()
        await close_sessions()
        for r in runners:
            await r.cleanup()
        return dead, stuck, found, fresh, routed_before, replies

    dead, stuck, found, fresh, routed_before, replies = asyncio.run(main())
    assert found[dead.url].startswith("died: fake engine") and found[stuck.url].startswith("no answer to GET /health")
    assert stuck.terminated and routed_before == [] and replies == {"fresh0", "fresh1"}
    assert [e.device for e in LAUNCHED[2:]] == ["cuda:0", "cuda:1"]  # each on its predecessor's GPU
    assert [e.log_path.rsplit("/", 1)[1] for e in LAUNCHED[2:]] == ["engine_0.restart1.log", "engine_1.restart2.log"]


def test_with_fault_tolerance_a_fleet_call_skips_an_engine_replaced_meanwhile(spec):
    """A fleet-wide call that a dead engine fails waits for its replacement instead of failing the step."""
    import dataclasses

    async def main():
        runners = [await serve(3, "a"), await serve(5, "b")]
        fleet = EngineFleet(dataclasses.replace(spec, hold_s=10.0))
        await fleet.start(2)
        await runners[0].cleanup()  # engine a is gone: its calls fail
        call = asyncio.ensure_future(fleet.weight_version())
        await asyncio.sleep(0.3)
        await fleet.remove(LAUNCHED[0].url, wait_s=0.1)  # the health manager takes it out
        version = await call
        await fleet.stop()
        await close_sessions()
        await runners[1].cleanup()
        return version

    assert asyncio.run(main()) == 5  # only the live engine's version counts
