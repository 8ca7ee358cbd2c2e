"""DCS coordinator state: registrations, lanes by cadence, topology versions, published weights."""

from __future__ import annotations

import pytest

from relax.distributed.checkpoint_service.coordinator import Coordinator, Receivers, lane_due


def test_topology_version_bumps_on_every_change_and_orders_roles():
    c = Coordinator()
    assert c.topology().version == 0 and c.topology().lanes == []
    assert c.register("rollout", Receivers(["http://a", "http://b"], [("n:0",), ("n:1",)])) == 1
    assert c.register("actor_fwd", Receivers(["fwd0"])) == 2
    (lane,) = c.topology().lanes
    assert lane.every == 1 and lane.endpoints == ["fwd0", "http://a", "http://b"]  # roles sorted, order kept
    assert lane.devices == [(), ("n:0",), ("n:1",)]  # aligned with the endpoints (CPU: none)
    assert lane.roles == {"actor_fwd": 1, "rollout": 2}
    with pytest.raises(ValueError, match="1 device lists for 2 receivers"):
        Receivers(["http://a", "http://b"], [("n:0",)])
    assert c.register("rollout", Receivers(["http://a"])) == 3  # an engine left: the sender must rebuild
    assert c.unregister("actor_fwd") == 4
    assert c.unregister("actor_fwd") == 4  # nothing changed, no bump
    assert c.topology().lanes[0].endpoints == ["http://a"]


def test_receivers_of_another_cadence_get_a_lane_of_their_own():
    c = Coordinator()
    c.register("rollout", Receivers(["http://a"]))
    c.register("reference", Receivers(["ref0", "ref1"], every=3))
    c.register("actor_fwd", Receivers(["fwd0"]))
    topo = c.topology()
    assert [(lane.every, lane.endpoints) for lane in topo.lanes] == [(1, ["fwd0", "http://a"]), (3, ["ref0", "ref1"])]
    assert topo.roles == {"actor_fwd": 1, "rollout": 1, "reference": 2}
    with pytest.raises(ValueError, match="every >= 1"):
        Receivers(["ref0"], every=0)


def test_a_lane_is_due_every_cadence_but_only_lane_one_at_version_zero():
    assert [lane_due(2, k) for k in range(5)] == [False, False, True, False, True]
    assert all(lane_due(1, k) for k in range(5))  # the engines start from the actor's version 0


def test_publish_records_the_latest_push():
    c = Coordinator()
    assert c.latest() is None
    c.register("rollout", Receivers(["http://a"]))
    c.publish(3, {"bytes": 10.0, "seconds": 0.5})
    c.publish(4, {"bytes": 10.0, "seconds": 0.25})
    latest = c.latest()
    assert latest["version"] == 4 and latest["seconds"] == 0.25 and latest["topology_version"] == 1
    assert [h["version"] for h in c.history] == [3, 4]
