"""A RayEndpoint (relax.distributed.weights.endpoints) crosses a process that only stores it (the
DCS coordinator's role) without that process importing the rank's class, and works where it is
used: real Ray actors on the session's local Ray."""

from __future__ import annotations

import asyncio
import pickle
import sys

import ray

from relax.distributed.weights.endpoints import RayEndpoint

RANK_MODULE = "tests.unit.distributed.ray.endpoint_rank"


@ray.remote(num_cpus=0)
class Store:
    """What the coordinator does with endpoints: keep them, hand them back."""

    def __init__(self) -> None:
        self.kept: list = []

    def put(self, endpoints: list) -> list[str]:
        self.kept = endpoints
        return [repr(e) for e in endpoints]

    def get(self) -> list:
        return self.kept

    def imported(self) -> bool:
        return RANK_MODULE in sys.modules


@ray.remote(num_cpus=0)
def post_through(endpoints: list) -> list[dict]:
    """The sender's side, in another process: call each endpoint's rank."""
    return [asyncio.run(e.post("/update_weights_from_tensor", {"n": i}, timeout_s=60)) for i, e in enumerate(endpoints)]


def test_an_endpoint_passes_through_a_store_without_importing_the_ranks_class(ray_local):
    from tests.unit.distributed.ray.endpoint_rank import Rank

    ranks = [ray.remote(num_cpus=0)(Rank).remote() for _ in range(2)]
    endpoints = [RayEndpoint(r, f"actor_fwd[{i}]") for i, r in enumerate(ranks)]
    store = Store.remote()
    assert ray.get(store.put.remote(endpoints)) == ["RayEndpoint(actor_fwd[0])", "RayEndpoint(actor_fwd[1])"]
    assert ray.get(store.imported.remote()) is False
    replies = ray.get(post_through.remote(ray.get(store.get.remote())))
    assert [r["payload"] for r in replies] == [{"n": 0}, {"n": 1}] and all(r["success"] for r in replies)
    assert ray.get(store.imported.remote()) is False  # (handing them back did not unpickle them either)


def test_a_pickled_endpoint_keeps_its_name_and_unpickles_its_handle_on_use(ray_local):
    from tests.unit.distributed.ray.endpoint_rank import Rank

    rank = ray.remote(num_cpus=0)(Rank).remote()
    copy = pickle.loads(pickle.dumps(RayEndpoint(rank, "reference[0]")))
    assert repr(copy) == "RayEndpoint(reference[0])" and copy._handle is None
    assert asyncio.run(copy.post("/p", {}, timeout_s=60))["path"] == "/p"
    assert pickle.loads(pickle.dumps(copy)).name == "reference[0]"
