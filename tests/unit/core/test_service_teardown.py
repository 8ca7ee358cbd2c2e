"""Runtime's teardown of a run's Serve apps (the rest of Runtime runs in tests/integration/test_service.py)."""

from __future__ import annotations

import types

import pytest

from relax.core import service
from relax.distributed.ray import nodes as ray_nodes


@pytest.fixture()
def runtime(monkeypatch):
    """A Runtime of four apps over two nodes (10.0.0.1: actor, dcs; 10.0.0.2: rollout, reference), with
    Serve's delete and status calls recorded; `state["lost"]` names the nodes gone from the cluster."""
    rt = service.Runtime.__new__(service.Runtime)
    rt.run_id, rt.apps = "r1", [f"relax-r1-{role}" for role in ("actor", "rollout", "reference", "dcs")]
    rt.nodes = [types.SimpleNamespace(ip="10.0.0.1", node_id="a"), types.SimpleNamespace(ip="10.0.0.2", node_id="b")]
    rt.role_ips = {"actor": "10.0.0.1", "dcs": "10.0.0.1", "rollout": "10.0.0.2", "reference": "10.0.0.2"}
    state = {"deleted": [], "polls": 0, "lost": set()}
    serve = pytest.importorskip("ray.serve")
    monkeypatch.setattr(serve, "delete", lambda app, _blocking=True: state["deleted"].append(app))
    monkeypatch.setattr(ray_nodes, "lost_nodes", lambda nodes: [n for n in nodes if n.ip in state["lost"]])

    def app_states():  # the lost node's apps never go (their replicas cannot stop); the others after 2 polls
        state["polls"] += 1
        stuck = {a for a in rt.apps if rt.role_ips[a.rsplit("-", 1)[1]] in state["lost"]}
        return {a: None for a in rt.apps if a in stuck or state["polls"] <= 2}

    monkeypatch.setattr(service, "app_states", app_states)
    monkeypatch.setattr(service.time, "sleep", lambda s: None)
    return rt, state


def test_teardown_deletes_every_app_and_waits_until_they_are_gone(runtime):
    rt, state = runtime
    rt._delete_apps(timeout_s=5)
    assert sorted(state["deleted"]) == sorted(rt.apps) and state["polls"] == 3


def test_after_a_node_left_the_apps_of_its_roles_are_deleted_but_not_waited_for(runtime, caplog):
    """Serve restarted their replicas pinned to the lost node: they never start, cannot stop, and are
    force-killed only after graceful_shutdown_timeout_s, which a global restart would wait for."""
    rt, state = runtime
    state["lost"] = {"10.0.0.2"}
    with caplog.at_level("INFO", logger="relax.core.service"):
        rt._delete_apps(timeout_s=5)
    assert sorted(state["deleted"]) == sorted(rt.apps)  # all deleted
    assert state["polls"] == 3  # and the live node's gone after their 2 polls: no wait to the deadline
    assert "not waiting for the Serve apps of reference, rollout: their node left the cluster" in caplog.text
