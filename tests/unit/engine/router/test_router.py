"""The router spreads requests to the least-busy engine and forwards replies unchanged."""

import asyncio

import pytest
from aiohttp import web

from relax.engine.router.router import Router


def test_pick_prefers_least_busy_then_round_robin():
    r = Router(["http://a", "http://b", "http://c"])
    r.in_flight.update({"http://a": 2, "http://b": 0, "http://c": 0})
    assert {r.pick(), r.pick()} == {"http://b", "http://c"}


def test_router_needs_an_engine():
    with pytest.raises(ValueError):
        Router([])


def test_forwards_to_engines_with_auth_and_balances():
    async def scenario():
        seen = []

        async def generate(request):
            seen.append((request.host, request.headers.get("Authorization")))
            await asyncio.sleep(0.05)
            return web.json_response({"text": "ok", "meta_info": {}})

        runners, urls = [], []
        for _ in range(2):
            app = web.Application()
            app.router.add_post("/generate", generate)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
        router = Router(urls, api_key="secret")
        await router.start()
        import aiohttp

        async with aiohttp.ClientSession() as s:
            async def one():
                async with s.post(f"{router.url}/generate", json={"input_ids": [1]}) as resp:
                    return resp.status, await resp.json()
            results = await asyncio.gather(*(one() for _ in range(8)))
            async with s.post(f"{router.url}/generate", data=b"not json") as resp:
                bad = resp.status
        await router.stop()
        for runner in runners:
            await runner.cleanup()
        return seen, results, bad

    seen, results, bad = asyncio.run(scenario())
    assert all(status == 200 and body["text"] == "ok" for status, body in results)
    assert {auth for _, auth in seen} == {"Bearer secret"}
    assert len({host for host, _ in seen}) == 2  # both engines got work
    assert bad == 400


def test_engines_join_and_leave_a_running_router():
    r = Router(["http://a"])
    r.add_engine("http://b")
    r.in_flight["http://a"] = 3
    assert r.pick() == "http://b" and r.engine_urls == ["http://a", "http://b"]
    r.remove_engine("http://b")
    assert r.pick() == "http://a" and "http://b" not in r.in_flight
    with pytest.raises(ValueError, match="last engine"):
        r.remove_engine("http://a")


def test_pick_avoids_engines_that_just_failed_while_another_is_left():
    r = Router(["http://a", "http://b"])
    assert r.pick(avoid={"http://a"}) == "http://b"
    assert r.pick(avoid={"http://a", "http://b"}) in {"http://a", "http://b"}


def test_a_request_refused_by_a_dead_engine_goes_to_a_live_one():
    """One engine is gone (its port refuses connections): every request still succeeds, sent again
    to the other engine, instead of failing or retrying the dead one."""
    import socket

    import aiohttp

    async def scenario():
        async def generate(request):
            return web.json_response({"text": "live", "meta_info": {}})

        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        live = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        router = Router([dead, live], describe=lambda url: f"described {url}")
        await router.start()
        async with aiohttp.ClientSession() as s:
            async def one():
                async with s.post(f"{router.url}/generate", json={"input_ids": [1]}) as resp:
                    return resp.status, await resp.json()
            results = await asyncio.gather(*(one() for _ in range(6)))
        await router.stop()
        await runner.cleanup()
        return results

    results = asyncio.run(scenario())
    assert all(status == 200 and body["text"] == "live" for status, body in results)


async def _engine(reply: str, hang: asyncio.Event | None = None) -> tuple[web.AppRunner, str, list]:
    """A /generate server answering `reply`; with `hang`, it holds every request until the event is set."""
    got: list = []

    async def generate(request):
        got.append(await request.json())
        if hang is not None:
            await hang.wait()
        return web.json_response({"text": reply})

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", got


def test_fault_tolerance_resends_the_requests_of_an_engine_taken_out():
    """A hung engine taken out of the router (the health manager found it): each of its requests in
    flight is sent again to a live engine and answered exactly once."""
    import aiohttp

    async def scenario():
        hang = asyncio.Event()
        hung_runner, hung, hung_got = await _engine("hung", hang)
        live_runner, live, live_got = await _engine("live")
        router = Router([hung, live], hold_s=30.0)
        await router.start()
        router.in_flight[live] = 100  # everything goes to the hung engine first
        async with aiohttp.ClientSession() as s:
            async def one(i):
                async with s.post(f"{router.url}/generate", json={"i": i}) as resp:
                    return resp.status, await resp.json()
            calls = asyncio.gather(*(one(i) for i in range(4)))
            while len(hung_got) < 4:
                await asyncio.sleep(0.01)
            router.in_flight[live] = 0
            resent = router.remove_engine(hung)
            results = await calls
        hang.set()
        await router.stop()
        await hung_runner.cleanup()
        await live_runner.cleanup()
        return resent, results, sorted(p["i"] for p in live_got), router.resent

    resent, results, live_got, counted = asyncio.run(scenario())
    assert resent == 4 and counted == 4 and live_got == [0, 1, 2, 3]
    assert results == [(200, {"text": "live"})] * 4


def test_fault_tolerance_holds_requests_while_the_last_engine_is_replaced():
    """The only engine dies: requests wait (instead of failing) until its replacement joins."""
    import socket

    import aiohttp

    async def scenario():
        with socket.socket() as s:  # a port nothing listens on: the dead engine
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        router = Router([dead], hold_s=30.0)
        await router.start()
        async with aiohttp.ClientSession() as s:
            async def one():
                async with s.post(f"{router.url}/generate", json={}) as resp:
                    return resp.status, await resp.json()
            calls = asyncio.gather(one(), one())
            await asyncio.sleep(0.3)
            router.remove_engine(dead)  # the last one: allowed with fault tolerance
            runner, fresh, _ = await _engine("fresh")
            router.add_engine(fresh)
            results = await calls
        await router.stop()
        await runner.cleanup()
        return results

    assert asyncio.run(scenario()) == [(200, {"text": "fresh"})] * 2


def test_a_drained_engine_gets_no_new_request_and_comes_back_when_undrained():
    r = Router(["http://a", "http://b"])
    r.drain_engine("http://a")
    assert {r.pick() for _ in range(4)} == {"http://b"} and r.draining == {"http://a"}
    with pytest.raises(ValueError, match="last engine taking requests"):
        r.drain_engine("http://b")
    with pytest.raises(ValueError, match="last engine"):
        r.remove_engine("http://b")
    r.undrain_engine("http://a")
    assert {r.pick() for _ in range(4)} == {"http://a", "http://b"} and not r.draining
    r.drain_engine("http://a")
    assert r.remove_engine("http://a") == 0 and r.engine_urls == ["http://b"] and not r.draining
