"""A facade over N Ray actors that form one data-parallel group.

Components talk to "the actor" or "the reference" as one object; the group fans a call out
to every rank (`call`) or hands each rank its own shard (`call_sharded`) and gathers the
results, so per-rank plumbing stays out of component code.
"""

from __future__ import annotations

from typing import Any, Sequence

import ray

from relax.utils.net import free_port


class RayActorGroup:
    """`world_size` instances of `worker_cls` (a plain class), each a Ray actor process.

    Every worker is constructed as `worker_cls(rank, world_size, master_addr, master_port,
    *args)` so it can join one torch.distributed group.
    """

    def __init__(self, worker_cls: type, world_size: int, *args: Any, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, env_vars: dict[str, str] | None = None, name: str = "worker") -> None:
        master_addr = "127.0.0.1"
        master_port = free_port()
        remote_cls = ray.remote(worker_cls)
        runtime_env = {"env_vars": dict(env_vars or {})}
        self.world_size = world_size
        self.workers = [
            remote_cls.options(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=runtime_env,
                               name=None).remote(rank, world_size, master_addr, master_port, *args)
            for rank in range(world_size)
        ]
        self.name = name

    async def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run `method(*args, **kwargs)` on every rank; results in rank order."""
        refs = [getattr(w, method).remote(*args, **kwargs) for w in self.workers]
        return [await ref for ref in refs]

    async def call_sharded(self, method: str, shards: Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Rank r gets `shards[r]` as its first argument."""
        if len(shards) != self.world_size:
            raise ValueError(f"{self.name}: {len(shards)} shards for {self.world_size} ranks")
        refs = [getattr(w, method).remote(shard, *args, **kwargs) for w, shard in zip(self.workers, shards)]
        return [await ref for ref in refs]

    async def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.workers[0], method).remote(*args, **kwargs)

    def kill(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
