"""post/get: JSON round trip, and a non-2xx reply raises with the server's message."""

import asyncio

import pytest
from aiohttp import web

from relax.utils.http_utils import HTTPError, close_sessions, get, post


def test_post_returns_json_and_errors_carry_the_body():
    async def scenario():
        async def echo(request):
            return web.json_response({"got": await request.json()})

        async def fail(request):
            return web.json_response({"error": "bad sampling_params"}, status=400)

        app = web.Application()
        app.router.add_post("/echo", echo)
        app.router.add_post("/fail", fail)
        async def ok(request):
            return web.json_response({"ok": True})

        app.router.add_get("/echo", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            assert await post(f"{base}/echo", {"a": 1}) == {"got": {"a": 1}}
            assert await get(f"{base}/echo") == {"ok": True}
            with pytest.raises(HTTPError, match="400.*bad sampling_params"):
                await post(f"{base}/fail", {})
        finally:
            await close_sessions()
            await runner.cleanup()

    asyncio.run(scenario())


def test_an_http_error_shows_the_servers_message_with_its_line_breaks_and_the_end_of_a_long_one():
    import json

    tail = "\n".join(f"log line {i}" for i in range(1000))
    err = HTTPError("http://r/generate", 502, json.dumps({"error": f"engine unreachable\n{tail}"}))
    text = str(err)
    assert text.startswith("http://r/generate -> HTTP 502: engine unreachable\nlog line 0")
    assert text.endswith("log line 999") and "characters ...]" in text and len(text) < 4200
    assert str(HTTPError("u", 500, "plain text")) == "u -> HTTP 500: plain text"
