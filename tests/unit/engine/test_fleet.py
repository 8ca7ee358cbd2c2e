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
    LAUNCHED.append(engine)
    return engine


async def serve(version: int, name: str) -> web.AppRunner:
    async def generate(request):
        return web.json_response({"text": name})

    app = web.Application()
    app.router.add_post("/generate", generate)
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
    assert version == 3 and busy == [4.5, 7.5]  # the oldest version any engine holds; per-engine busy time
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
    from relax.backends.engine_client import EngineError

    async def main():
        runner = await serve(1, "e1")
        fleet = EngineFleet(spec)
        await fleet.start(1)
        await runner.cleanup()  # the engine is gone: connections are refused
        try:
            with pytest.raises(EngineError) as err:
                await fleet.each("get_weight_version")
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
    assert "no reply" in message and "ConnectError" in message and "(after 4 attempts)" in message
    assert "rollout fake engine at" in message and "exited with code 7" in message and "CUDA error: boom" in message
    assert routed is not None and routed.status == 502
    assert "unreachable" in routed.body and "exited with code 7" in routed.body and "CUDA error: boom" in routed.body
