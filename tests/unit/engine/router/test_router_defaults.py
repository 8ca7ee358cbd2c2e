"""The router's request defaults: a LoRA run on SGLang engines names the adapter (`lora_path`) in every
request it forwards, unless the request names one itself."""

import asyncio

import aiohttp
from aiohttp import web

from relax.engine.router.router import Router


def test_forwarded_requests_get_the_defaults_they_do_not_set():
    async def scenario():
        seen = []

        async def generate(request):
            seen.append(await request.json())
            return web.json_response({"text": "ok"})

        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        router = Router([url], defaults={"lora_path": "relax-policy"})
        await router.start()
        async with aiohttp.ClientSession() as s:
            for payload in ({"input_ids": [1]}, {"input_ids": [[1], [2]]}, {"input_ids": [1], "lora_path": "mine"}):
                async with s.post(f"{router.url}/generate", json=payload) as resp:
                    assert resp.status == 200
        await router.stop()
        await runner.cleanup()
        return seen

    seen = asyncio.run(scenario())
    assert [p.get("lora_path") for p in seen] == ["relax-policy", "relax-policy", "mine"]
    assert seen[1]["input_ids"] == [[1], [2]]  # a batch names it once: SGLang applies a str to every row
