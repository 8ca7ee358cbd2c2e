"""SlimeRouter (--use-slime-router, `relax.engine.router.slime_router`): text prompts and every other
path forwarded to the engines through user middlewares (against a real hf engine in this process),
--slime-router-max-connections, --slime-router-timeout, and the health threshold (small local
engines that hold, hang or fail their health checks on cue); the flags' checks."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import slime_router_middlewares as middlewares
from aiohttp import web

from relax.config import ConfigError, parse_config
from relax.engine.fleet import EngineFleet, FleetSpec
from relax.engine.router.slime_router import HealthWatch, SlimeRouterSpec, slime_router
from tests.unit.engine.agentic.agentic_helpers import EngineServer

MW = middlewares.__name__


@pytest.fixture(scope="module")
def hf_engine(tmp_path_factory):
    from relax.backends.hf.tiny_model import build_tiny_qwen3

    server = EngineServer(str(build_tiny_qwen3(tmp_path_factory.mktemp("tiny"), seed=0)))
    yield server
    server.close()


def test_text_prompts_and_other_paths_reach_a_real_engine_through_the_middlewares(hf_engine):
    """Built by the fleet from --use-slime-router's spec, as a run builds it."""
    spec = SlimeRouterSpec(middleware_paths=(f"{MW}.Outer", f"{MW}.CapTokens"))

    async def scenario():
        fleet = EngineFleet(FleetSpec(name="rollout", backend="hf", model_path="m", external=(hf_engine.url,),
                                      slime_router=spec))
        await fleet.start(0)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{fleet.router_url}/generate", json={
                        "text": "hello world", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}) as r:
                    generated, engines = await r.json(), r.headers.get("X-Engines")
                async with s.get(f"{fleet.router_url}/get_model_info") as r:
                    info = (r.status, await r.json())
        finally:
            await fleet.stop()
        return generated, engines, info

    middlewares.ORDER.clear()
    generated, engines, (status, info) = asyncio.run(scenario())
    assert generated["meta_info"]["completion_tokens"] == 2 and generated["text"]  # capped by the middleware
    assert engines == "1" and status == 200 and "model_path" in info  # a path the default router does not serve
    assert middlewares.ORDER == ["outer", "cap POST /generate", "outer", "cap GET /get_model_info"]


async def fake_engine(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_max_connections_bounds_the_requests_an_engine_sees_at_once():
    async def scenario():
        state = {"now": 0, "most": 0, "auth": set()}
        pair = asyncio.Event()

        async def engine(request: web.Request) -> web.Response:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            state["auth"].add(request.headers.get("Authorization"))
            if state["now"] == 2:
                pair.set()
            await asyncio.wait_for(pair.wait(), 10)  # the first two are held until both are in
            state["now"] -= 1
            return web.json_response({"text": "ok", "path": request.path})

        runner, url = await fake_engine(engine)
        router = slime_router([url], SlimeRouterSpec(max_connections=2), api_key="key")
        await router.start()
        async with aiohttp.ClientSession() as s:
            async def one(path: str) -> int:
                async with s.post(router.url + path, json={"input_ids": [1]}) as r:
                    return r.status
            statuses = await asyncio.gather(*(one("/generate" if i % 2 else "/v1/completions") for i in range(6)))
        await router.stop()
        await runner.cleanup()
        return statuses, state

    statuses, state = asyncio.run(scenario())
    assert statuses == [200] * 6
    assert state["most"] == 2  # two at once, never more: the others waited for a connection
    assert state["auth"] == {"Bearer key"}  # the run's key is added on every forwarded path


def test_a_request_the_engine_does_not_answer_in_the_timeout_gets_504():
    async def scenario():
        release = asyncio.Event()  # set at the end: the engine's server waits for its handlers to end

        async def hang(request: web.Request) -> web.Response:
            await release.wait()
            return web.Response()

        runner, url = await fake_engine(hang)
        router = slime_router([url], SlimeRouterSpec(timeout_s=0.3))
        await router.start()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{router.url}/generate", json={"text": "x"}) as r:
                generate = (r.status, (await r.json())["error"])
            async with s.get(f"{router.url}/get_server_info") as r:
                proxied = (r.status, (await r.json())["error"])
        release.set()
        await router.stop()
        await runner.cleanup()
        return generate, proxied

    generate, proxied = asyncio.run(scenario())
    assert generate[0] == proxied[0] == 504
    assert "did not reply in time" in generate[1] and "did not reply in time" in proxied[1]


def test_an_engine_failing_threshold_health_checks_in_a_row_gets_no_new_requests_until_admitted():
    async def scenario():
        health = {"ok": True}

        async def good(request: web.Request) -> web.Response:
            return web.json_response({"engine": "good"})

        async def flaky(request: web.Request) -> web.Response:
            if request.path == "/health":
                return web.Response(status=200 if health["ok"] else 503)
            return web.json_response({"engine": "flaky"})

        (r1, good_url), (r2, flaky_url) = await fake_engine(good), await fake_engine(flaky)
        router = slime_router([good_url, flaky_url], SlimeRouterSpec())
        watch = HealthWatch(threshold=2, interval_s=60)
        await router.start()
        async with aiohttp.ClientSession() as s:
            health["ok"] = False
            first = await watch.check(router, s)
            health["ok"] = True
            await watch.check(router, s)  # a success resets the count
            health["ok"] = False
            rounds = [await watch.check(router, s) for _ in range(2)]
            served = []
            for _ in range(4):
                async with s.post(f"{router.url}/generate", json={"input_ids": [1]}) as r:
                    served.append((await r.json())["engine"])
            router.add_engine(flaky_url)  # the fleet admits it again
            routed_again = list(router.engine_urls)
        await router.stop()
        await r1.cleanup()
        await r2.cleanup()
        return first, rounds, served, routed_again, good_url, flaky_url

    first, rounds, served, routed_again, good_url, flaky_url = asyncio.run(scenario())
    assert first == [] and rounds == [[], [flaky_url]]
    assert served == ["good"] * 4
    assert routed_again == [good_url, flaky_url]


def test_the_health_watch_runs_on_its_own_at_the_health_check_interval():
    async def scenario():
        async def down(request: web.Request) -> web.Response:
            return web.Response(status=503 if request.path == "/health" else 200)

        async def up(request: web.Request) -> web.Response:
            return web.Response(status=200)

        (r1, down_url), (r2, up_url) = await fake_engine(down), await fake_engine(up)
        router = slime_router([down_url, up_url], SlimeRouterSpec(failure_threshold=1, check_interval_s=0.05))
        await router.start()
        for _ in range(200):  # polled, at most 10 s
            if router.unhealthy:
                break
            await asyncio.sleep(0.05)
        await router.stop()
        await r1.cleanup()
        await r2.cleanup()
        return router.unhealthy, router.engine_urls, down_url, up_url

    unhealthy, routed, down_url, up_url = asyncio.run(scenario())
    assert unhealthy == {down_url} and routed == [up_url]


@pytest.mark.parametrize("path, needle", [
    (f"{MW}.StarletteMiddleware", "is a Starlette middleware .* take an aiohttp web.Request"),
    (f"{MW}.SyncDispatch", "has no `async def dispatch"),
    (f"{MW}.NoRouterKeyword", r"cannot be called as class Middleware\(app, \*, router\)"),
    (f"{MW}.ORDER", "is not a class"),
])
def test_a_middleware_that_does_not_fit_fails_at_start_with_the_contract(base, path, needle):
    with pytest.raises(ConfigError, match=r"--slime-router-middleware-paths.*" + needle):
        parse_config(base + ["--use-slime-router", "--slime-router-middleware-paths", path])


def test_slime_router_flags_are_checked_and_need_use_slime_router(base):
    from relax.config.inert import inert_flag_notes

    cfg = parse_config(base + ["--use-slime-router", "--slime-router-middleware-paths", f"{MW}.CapTokens",
                               "--slime-router-timeout", "30", "--slime-router-max-connections", "64",
                               "--slime-router-health-check-failure-threshold", "5",
                               "--rollout-health-check-interval", "7", "--rollout-health-check-timeout", "2"])
    assert SlimeRouterSpec.from_config(cfg) == SlimeRouterSpec(
        middleware_paths=(f"{MW}.CapTokens",), timeout_s=30.0, max_connections=64, failure_threshold=5,
        check_interval_s=7.0, check_timeout_s=2.0)
    assert SlimeRouterSpec.from_config(parse_config(base)) is None
    with pytest.raises(ConfigError, match="--use-slime-router .* --sglang-router-ip"):
        parse_config(base + ["--use-slime-router", "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "1"])
    with pytest.raises(ConfigError, match="--slime-router-max-connections must be >= 1"):
        parse_config(base + ["--use-slime-router", "--slime-router-max-connections", "0"])
    notes = inert_flag_notes(parse_config(base + ["--slime-router-timeout", "5"]))
    assert any(n.startswith("--slime-router-timeout: no effect") and "--use-slime-router" in n for n in notes)
