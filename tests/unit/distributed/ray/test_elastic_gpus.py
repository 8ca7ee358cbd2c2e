"""GPUs for engines a scale-out adds (`ElasticGpus`, and `LocalFleetOps` giving them back): Ray's
accounting of two logical GPUs on this CPU machine; the engines themselves are a stand-in fleet,
since starting one on a GPU needs the GPU."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from relax.distributed.ray.elastic_gpus import ElasticGpus, free_gpus_on
from relax.engine.elastic.local_ops import LocalFleetOps


@pytest.fixture
def gpus(ray_local):
    if ray.cluster_resources().get("GPU", 0) < 2:
        pytest.skip("the Ray cluster up in this process has no logical GPUs (a one-process run of the suite)")
    held = ElasticGpus(1)
    assert _room_becomes(held, 2) == 2  # (an earlier test's slots may still be going)
    yield held
    held.release_all()


def _room_becomes(gpus: ElasticGpus, want: int) -> int:
    deadline = time.monotonic() + 20  # a killed slot actor's GPU comes back asynchronously
    while gpus.room() != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return gpus.room()


def test_engines_hold_whole_free_gpus_of_this_node_and_give_them_back(gpus):
    assert gpus.room() == 2
    first, second = gpus.acquire(30), gpus.acquire(30)
    assert {first, second} == {"cuda:0", "cuda:1"} and _room_becomes(gpus, 0) == 0
    node = ray.get_runtime_context().get_node_id()
    assert gpus.identities()[first] == (f"{node}:{first[-1]}",)
    with pytest.raises(RuntimeError, match=f"were not granted on node {node}.*0 free"):
        gpus.acquire(2)
    gpus.release(first)
    gpus.release("cuda:7")  # not held here (a startup engine's): nothing happens
    assert _room_becomes(gpus, 1) == 1 and free_gpus_on(node) == 1
    assert gpus.acquire(30) == first


class StandInFleet:
    """The fleet's side of a scale-out: engines 'launch' on the devices given; `bad` ones fail."""

    def __init__(self, bad: set[int] = frozenset()) -> None:
        self.bad, self.devices, self.launched = bad, {}, 0

    async def launch(self, count, timeout, tag, devices=None):
        results = []
        for device in devices:
            i, self.launched = self.launched, self.launched + 1
            if i in self.bad:
                results.append({"error": "engine exited during start-up"})
            else:
                self.devices[f"http://e{i}"] = device
                results.append({"url": f"http://e{i}"})
        return results

    def device_of(self, url):
        return self.devices.get(url)

    async def release(self, url, timeout):
        self.devices.pop(url)

    async def abandon(self, tag):
        return list(self.devices)


def test_a_scale_out_gives_back_the_gpus_of_failed_released_and_undone_engines(gpus):
    async def go():
        ops = LocalFleetOps(StandInFleet(bad={1}), gpus=gpus)
        assert await ops.capacity() == 2
        first = await ops.launch(2, 30, "op-1")  # the second engine fails to start: its GPU is freed
        assert first[0] == {"url": "http://e0"} and "error" in first[1]
        assert await asyncio.to_thread(_room_becomes, gpus, 1) == 1
        more = await ops.launch(2, 5, "op-2")  # one GPU left: the second engine gets none, and says why
        assert more[0] == {"url": "http://e2"} and "not granted" in more[1]["error"]
        await ops.release("http://e0", 1)  # a scaled-in engine's GPU comes back
        assert await asyncio.to_thread(_room_becomes, gpus, 1) == 1
        await ops.abandon("op-2")  # a cancelled operation's GPUs come back
        assert await asyncio.to_thread(_room_becomes, gpus, 2) == 2

    asyncio.run(go())
