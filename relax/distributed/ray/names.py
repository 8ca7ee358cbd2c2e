"""Whether a named Ray actor is up: how a run finds the Serve and TransferQueue controllers that a
test session (or an earlier run in this process) already started, and so does not start them twice."""

from __future__ import annotations


def named_actor_running(name: str, namespace: str) -> bool:
    """A live actor called `name` exists in `namespace` on the connected Ray cluster."""
    import ray

    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True
