"""RayActorGroup: a rendezvous port taken between picking it and binding it restarts the ranks
on a new port instead of failing the run (seen in CI as EADDRINUSE from a critic group)."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest
import ray

from relax.distributed.ray import actor_group
from relax.distributed.ray.actor_group import RayActorGroup

# The workers below travel by value: Ray workers (of this test's cluster or of an integration
# session's) cannot import a test module by name.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class GlooWorker:
    """Joins a real gloo group, as the fsdp worker does in its constructor."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                world_size=world_size)
        self.port = master_port

    def rendezvous_port(self) -> int:
        return self.port


class FailingWorker:
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        raise ValueError("bad model path")

    def ping(self) -> None:
        pass


def test_taken_port_restarts_group_on_a_new_port(ray_local, monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()  # another process's server on the port the group picked
    taken = holder.getsockname()[1]
    ports = iter([taken])
    real_free_port = actor_group.free_port
    monkeypatch.setattr(actor_group, "free_port", lambda: next(ports, None) or real_free_port())
    try:
        group = RayActorGroup(GlooWorker, 2, num_cpus=1, name="gloo")
        ports_seen = asyncio.run(group.on_all(lambda w: w.rendezvous_port.remote()))
    finally:
        holder.close()
    assert ports_seen[0] == ports_seen[1] != taken
    group.kill()


def test_other_construction_errors_are_raised(ray_local):
    group = RayActorGroup(FailingWorker, 1, num_cpus=1, name="failing")
    with pytest.raises(ray.exceptions.RayActorError, match="bad model path"):
        asyncio.run(group.on_all(lambda w: w.ping.remote()))
