"""EngineClient: SGLang payloads, auth header, and every failure raised as EngineError."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

from relax.distributed.engine_client import EngineClient, EngineError
from relax.utils.http_utils import TRANSPORT_RETRIES


def _client(handler, api_key="k") -> EngineClient:
    return EngineClient("http://engine:1/", api_key, timeout=5, transport=httpx.MockTransport(handler))


def _call(handler, method: str, *args, **kwargs):
    async def go():
        async with _client(handler) as client:
            return await getattr(client, method)(*args, **kwargs)
    return asyncio.run(go())


def test_generate_posts_payload_with_bearer_token():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(path=request.url.path, auth=request.headers.get("authorization"), body=json.loads(request.content))
        return httpx.Response(200, json={"text": "x", "output_ids": [1], "meta_info": {}})

    reply = _call(handler, "generate", {"input_ids": [1, 2]})
    assert reply["output_ids"] == [1]
    assert seen == {"path": "/generate", "auth": "Bearer k", "body": {"input_ids": [1, 2]}}


def test_update_weights_sends_sglang_dtype_names_and_version_string():
    seen = {}

    def handler(request):
        seen.update(json.loads(request.content))
        return httpx.Response(200, json={"success": True, "message": "ok"})

    _call(handler, "update_weights_from_distributed", names=["w"], dtypes=[torch.bfloat16],
          shapes=[torch.Size([2, 3])], group_name="g", weight_version=3)
    assert seen == {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2, 3]], "group_name": "g",
                    "flush_cache": False, "weight_version": "3"}


@pytest.mark.parametrize("status, body, message", [
    (400, {"error": {"message": "bad prompt"}}, "bad prompt"),
    (400, {"success": False, "message": "unknown tensor w"}, "unknown tensor w"),
    (200, {"success": False, "message": "rejected"}, "rejected"),
    (401, {"detail": "no key"}, "no key"),
    (503, "plain text", "plain text"),
])
def test_error_replies_raise_engine_error_with_message_and_url(status, body, message):
    def handler(request):
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    with pytest.raises(EngineError) as info:
        _call(handler, "init_weights_update_group", master_address="h", master_port=1, rank_offset=1, world_size=2)
    assert info.value.message == message and info.value.status == status
    assert info.value.url == "http://engine:1/init_weights_update_group"
    assert message in str(info.value)


def test_timeout_and_connection_errors_raise_engine_error():
    def slow(request):
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(EngineError, match="timed out"):
        _call(slow, "pause_generation")

    def down(request):
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(EngineError, match="ConnectError"):
        _call(down, "flush_cache")
    assert _call(down, "health") is False


def test_abort_request_needs_rid_or_abort_all():
    with pytest.raises(ValueError):
        _call(lambda r: httpx.Response(200), "abort_request")
    seen = {}

    def handler(request):
        seen.update(json.loads(request.content))
        return httpx.Response(200)

    assert _call(handler, "abort_request", rid="r1") is None
    assert seen == {"rid": "r1", "abort_all": False}


# ---- the network wire (aiohttp), against a real server on loopback ------------------------------------
class LoopbackEngine:
    """An aiohttp server on a free loopback port that records each request and answers by `reply(path, n)`:
    (status, JSON body), or "drop" to close the connection without a reply, or ("sleep", s)."""

    def __init__(self, reply):
        self.reply, self.seen, self.url = reply, [], None

    async def handle(self, request):
        from aiohttp import web

        body = await request.read()
        self.seen.append((request.method, request.path, request.headers.get("Authorization"),
                          request.headers.get("Content-Type"), json.loads(body) if body else None))
        answer = self.reply(request.path, len(self.seen))
        if answer == "drop":
            request.transport.close()  # the connection breaks before a reply
            raise ConnectionResetError("dropped")
        if answer[0] == "sleep":
            await asyncio.sleep(answer[1])
            answer = (200, {})
        status, payload = answer
        return web.Response(status=status, body=json.dumps(payload) if not isinstance(payload, str) else payload,
                            content_type="application/json" if not isinstance(payload, str) else "text/plain")

    async def __aenter__(self):
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def test_the_network_wire_sends_json_with_the_key_and_maps_replies_as_the_test_transport_does():
    def reply(path, n):
        return {"/generate": (200, {"output_ids": [7]}), "/update_weights_from_distributed":
                (400, {"success": False, "message": "unknown tensor w"}), "/flush_cache": (200, {"success": False,
                "message": "busy"}), "/model_info": (503, "plain text")}[path]

    async def go():
        async with LoopbackEngine(reply) as engine, EngineClient(engine.url + "/", "k", timeout=5) as client:
            assert (await client.generate({"input_ids": [1, 2], "text": "é"}))["output_ids"] == [7]
            errors = []
            for call in (client.update_weights_from_distributed(names=["w"], dtypes=["bfloat16"], shapes=[[1]]),
                         client.flush_cache(), client.get_model_info()):
                with pytest.raises(EngineError) as info:
                    await call
                errors.append((info.value.status, info.value.message, info.value.url))
            return engine.seen, errors, engine.url

    seen, errors, url = asyncio.run(go())
    assert seen[0] == ("POST", "/generate", "Bearer k", "application/json", {"input_ids": [1, 2], "text": "é"})
    assert seen[2][:2] == ("POST", "/flush_cache") and seen[2][4] is None  # no body, as SGLang's client sends it
    assert errors == [(400, "unknown tensor w", url + "/update_weights_from_distributed"),
                      (200, "busy", url + "/flush_cache"), (503, "plain text", url + "/model_info")]


def test_the_network_wire_retries_a_dropped_idempotent_call_only_and_names_a_dead_engine():
    async def go():
        async with LoopbackEngine(lambda path, n: "drop" if n == 1 else (200, {"success": True})) as engine:
            async with EngineClient(engine.url, timeout=5) as client:
                await client.continue_generation()  # dropped once, sent again
            retried = [s[1] for s in engine.seen]
            engine.seen.clear()
            async with EngineClient(engine.url, timeout=5) as client:
                with pytest.raises(EngineError, match="no reply") as info:
                    await client.init_weights_update_group(master_address="h", master_port=1, rank_offset=1,
                                                           world_size=2)
            once = [s[1] for s in engine.seen]
            url = engine.url
        async with EngineClient(url, timeout=5) as client:  # the server is gone: refused
            with pytest.raises(EngineError, match=r"no reply: .*ClientConnectorError") as refused:
                await client.pause_generation()
            healthy = await client.health(timeout=2)
        return retried, once, str(info.value), str(refused.value), healthy

    retried, once, message, refused, healthy = asyncio.run(go())
    assert retried == ["/continue_generation"] * 2
    assert once == ["/init_weights_update_group"] and "/init_weights_update_group" in message
    assert f"(after {TRANSPORT_RETRIES + 1} attempts)" in refused and healthy is False


def test_the_network_wire_times_out_and_serves_a_client_used_from_a_second_event_loop():
    async def serve(client, seconds):
        async with LoopbackEngine(lambda path, n: ("sleep", seconds)) as engine:
            client.url = engine.url
            client._wire.url = engine.url
            return await client.post("/pause_generation", {}, timeout=0.2)

    client = EngineClient("http://unset", timeout=5)
    with pytest.raises(EngineError, match="timed out"):
        asyncio.run(serve(client, 1.0))
    assert asyncio.run(serve(client, 0.0)) == {}  # a new loop: a new session, not the first loop's
