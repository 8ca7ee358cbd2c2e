"""The sender's receivers: an engine's HTTP API (through the one EngineClient) and a Ray-held
training rank, each mapping its failures onto the protocol's errors (404 -> EndpointMissing;
received, then refused -> BucketRejected; anything else -> WeightSyncError naming where and what)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import httpx
import pytest

from relax.distributed.weights.endpoints import HTTPEndpoint, RayEndpoint
from relax.distributed.weights.protocol import BucketRejected, EndpointMissing, WeightSyncError


def http_post(handler, path="/update_weights_from_distributed", timeout=5.0):
    endpoint = HTTPEndpoint("http://engine:1/", transport=httpx.MockTransport(handler))

    async def go():
        try:
            return await endpoint.post(path, {"group_name": "g"}, timeout)
        finally:
            await endpoint.close()

    return asyncio.run(go())


def test_http_endpoint_maps_the_engines_replies_onto_the_senders_errors():
    assert http_post(lambda r: httpx.Response(200, json={"success": True, "message": "ok"}))["message"] == "ok"
    with pytest.raises(EndpointMissing, match=r"http://engine:1/begin_weight_update: HTTP 404"):
        http_post(lambda r: httpx.Response(404, json={"detail": "Not Found"}), "/begin_weight_update")
    with pytest.raises(BucketRejected, match=r"engine:1/update_weights_from_distributed: HTTP 400: bad name"):
        http_post(lambda r: httpx.Response(400, json={"success": False, "message": "bad name"}))
    with pytest.raises(BucketRejected, match="late"):  # success: false with a 200 is a refusal too
        http_post(lambda r: httpx.Response(200, json={"success": False, "message": "late"}))
    with pytest.raises(WeightSyncError, match="HTTP 400: no group") as info:
        http_post(lambda r: httpx.Response(400, json={"error": {"message": "no group"}}))
    assert not isinstance(info.value, BucketRejected)  # refused before receiving: rebuild the group


def test_http_endpoint_retries_only_idempotent_paths_and_names_the_url_when_no_reply_comes():
    calls = []

    def flaky(request):
        calls.append(request.url.path)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("connection dropped", request=request)
        return httpx.Response(200, json={"message": "ok"})

    assert http_post(flaky, "/continue_generation")["message"] == "ok"  # sent again
    assert calls == ["/continue_generation"] * 2
    calls.clear()
    with pytest.raises(WeightSyncError, match=r"http://engine:1/init_weights_update_group: .*RemoteProtocolError"):
        http_post(flaky, "/init_weights_update_group")  # a group call never is
    assert calls == ["/init_weights_update_group"]

    def slow(request):
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(WeightSyncError, match=r"engine:1/pause_generation: .*timed out"):
        http_post(slow, "/pause_generation")


class FakeRemoteMethod:
    """Stands in for a Ray actor method (no Ray here): `.remote()` returns an ObjectRef-like
    object whose `.future()` resolves to the given reply, raises, or never resolves."""

    def __init__(self, reply=None, error=None, hang=False):
        self.reply, self.error, self.hang, self.calls = reply, error, hang, []

    def remote(self, path, payload):
        self.calls.append((path, payload))
        future: Future = Future()
        if self.error is not None:
            future.set_exception(self.error)
        elif not self.hang:
            future.set_result(self.reply)
        return type("Ref", (), {"future": lambda _self: future})()


class FakeHandle:
    def __init__(self, method):
        self.receive_weights = method


def ray_post(endpoint, path="/update_weights_from_distributed", timeout=5.0):
    return asyncio.run(endpoint.post(path, {"group_name": "g"}, timeout))


def test_ray_endpoint_success_and_errors_map_onto_the_senders():
    ok = FakeRemoteMethod(reply={"success": True, "message": "loaded"})
    assert ray_post(RayEndpoint(FakeHandle(ok), "fwd[0]"))["message"] == "loaded"
    assert ok.calls == [("/update_weights_from_distributed", {"group_name": "g"})]

    received = FakeRemoteMethod(reply={"success": False, "message": "bad name", "received": True})
    with pytest.raises(BucketRejected, match=r"fwd\[0\]/update_weights_from_distributed: bad name"):
        ray_post(RayEndpoint(FakeHandle(received), "fwd[0]"))

    refused = FakeRemoteMethod(reply={"success": False, "message": "no group", "received": False})
    with pytest.raises(WeightSyncError, match="no group") as info:
        ray_post(RayEndpoint(FakeHandle(refused), "fwd[0]"))
    assert not isinstance(info.value, BucketRejected)  # bytes may be on the wire: rebuild the group

    died = FakeRemoteMethod(error=RuntimeError("actor died"))
    with pytest.raises(WeightSyncError, match="actor died"):
        ray_post(RayEndpoint(FakeHandle(died), "fwd[1]"))


def test_ray_endpoint_deadline():
    hung = FakeRemoteMethod(hang=True)
    with pytest.raises(WeightSyncError, match="no reply within"):
        ray_post(RayEndpoint(FakeHandle(hung), "fwd[0]"), timeout=0.05)
