"""EngineClient: SGLang payloads, auth header, and every failure raised as EngineError."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

from relax.distributed.engine_client import EngineClient, EngineError


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
