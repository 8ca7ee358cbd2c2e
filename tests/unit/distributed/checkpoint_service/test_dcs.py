"""DCS coordinator state and the Ray receiver endpoint's error mapping."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

from relax.distributed.checkpoint_service.coordinator import Coordinator
from relax.distributed.checkpoint_service.transports import RayEndpoint
from relax.distributed.weight_sync import BucketRejected, WeightSyncError


def test_topology_version_bumps_on_every_change_and_orders_roles():
    c = Coordinator()
    assert c.topology() == {"version": 0, "endpoints": [], "devices": [], "roles": {}}
    assert c.register("rollout", ["http://a", "http://b"], [("n:0",), ("n:1",)]) == 1
    assert c.register("actor_fwd", ["fwd0"]) == 2
    topo = c.topology()
    assert topo["endpoints"] == ["fwd0", "http://a", "http://b"]  # roles sorted, order inside kept
    assert topo["devices"] == [(), ("n:0",), ("n:1",)]  # aligned with the endpoints (CPU: none)
    with pytest.raises(ValueError, match="1 device lists for 2 receivers"):
        c.register("rollout", ["http://a", "http://b"], [("n:0",)])
    assert topo["roles"] == {"actor_fwd": 1, "rollout": 2}
    assert c.register("rollout", ["http://a"]) == 3  # an engine left: the sender must rebuild
    assert c.unregister("actor_fwd") == 4
    assert c.unregister("actor_fwd") == 4  # nothing changed, no bump
    assert c.topology()["endpoints"] == ["http://a"]


def test_publish_records_the_latest_push():
    c = Coordinator()
    assert c.latest() is None
    c.register("rollout", ["http://a"])
    c.publish(3, {"bytes": 10.0, "seconds": 0.5})
    c.publish(4, {"bytes": 10.0, "seconds": 0.25})
    latest = c.latest()
    assert latest["version"] == 4 and latest["seconds"] == 0.25 and latest["topology_version"] == 1
    assert [h["version"] for h in c.history] == [3, 4]


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


def post(endpoint, path="/update_weights_from_distributed", timeout=5.0):
    return asyncio.run(endpoint.post(path, {"group_name": "g"}, timeout))


def test_ray_endpoint_success_and_errors_map_onto_the_senders():
    ok = FakeRemoteMethod(reply={"success": True, "message": "loaded"})
    assert post(RayEndpoint(FakeHandle(ok), "fwd[0]"))["message"] == "loaded"
    assert ok.calls == [("/update_weights_from_distributed", {"group_name": "g"})]

    received = FakeRemoteMethod(reply={"success": False, "message": "bad name", "received": True})
    with pytest.raises(BucketRejected, match=r"fwd\[0\]/update_weights_from_distributed: bad name"):
        post(RayEndpoint(FakeHandle(received), "fwd[0]"))

    refused = FakeRemoteMethod(reply={"success": False, "message": "no group", "received": False})
    with pytest.raises(WeightSyncError, match="no group") as info:
        post(RayEndpoint(FakeHandle(refused), "fwd[0]"))
    assert not isinstance(info.value, BucketRejected)  # bytes may be on the wire: rebuild the group

    died = FakeRemoteMethod(error=RuntimeError("actor died"))
    with pytest.raises(WeightSyncError, match="actor died"):
        post(RayEndpoint(FakeHandle(died), "fwd[1]"))


def test_ray_endpoint_deadline():
    hung = FakeRemoteMethod(hang=True)
    with pytest.raises(WeightSyncError, match="no reply within"):
        post(RayEndpoint(FakeHandle(hung), "fwd[0]"), timeout=0.05)
