"""A facade over N Ray actors that form one data-parallel group.

Components talk to "the actor" or "the reference" as one object; the group fans a call out
to every rank (`call`) or hands each rank its own shard (`call_sharded`) and gathers the
results, so per-rank plumbing stays out of component code.

The group's torch.distributed rendezvous port is picked in this process and bound seconds
later by rank 0, so another process may take it in between (EADDRINUSE). The first call on the
group waits for every rank to come up and, on that error, starts the ranks again on a new port.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import ray

from relax.utils.net import free_port

logger = logging.getLogger(__name__)

PORT_ATTEMPTS = 3


def _port_taken(exc: BaseException) -> bool:
    text = str(exc)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


class RayActorGroup:
    """`world_size` instances of `worker_cls` (a plain class), each a Ray actor process.

    Every worker is constructed as `worker_cls(rank, world_size, master_addr, master_port,
    *args)` so it can join one torch.distributed group.
    """

    def __init__(self, worker_cls: type, world_size: int, *args: Any, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, env_vars: dict[str, str] | None = None, name: str = "worker",
                 rank_options: Sequence[dict[str, Any]] | None = None) -> None:
        """`rank_options`: per rank, Ray options that place it (`relax.distributed.ray.placement.on_bundle`:
        its GPU share in the run's placement group); they replace `num_gpus`."""
        remote_cls = ray.remote(worker_cls)
        runtime_env = {"env_vars": dict(env_vars or {})}
        self.world_size = world_size
        self.name = name
        placed = list(rank_options) if rank_options is not None else [{"num_gpus": num_gpus}] * world_size
        if len(placed) != world_size:
            raise ValueError(f"{name}: {len(placed)} rank placements for {world_size} ranks")
        self._start = lambda port: [
            remote_cls.options(num_cpus=num_cpus, runtime_env=runtime_env, name=None,
                               **placed[rank]).remote(rank, world_size, "127.0.0.1", port, *args)
            for rank in range(world_size)
        ]
        self.workers = self._start(free_port())
        self._ready = False

    async def ready(self) -> None:
        """Wait for every rank's constructor; restart the group on a fresh port if its
        rendezvous port was taken meanwhile (any other construction error is raised)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                for w in self.workers:
                    await w.__ray_ready__.remote()
                self._ready = True
                return
            except ray.exceptions.RayActorError as exc:
                if not _port_taken(exc) or attempt == PORT_ATTEMPTS:
                    raise
                logger.warning("%s: rendezvous port taken by another process; restarting its %d ranks on a new "
                               "port (attempt %d of %d)", self.name, self.world_size, attempt + 1, PORT_ATTEMPTS)
                self.kill()
                self.workers = self._start(free_port())

    async def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run `method(*args, **kwargs)` on every rank; results in rank order."""
        if not self._ready:
            await self.ready()
        refs = [getattr(w, method).remote(*args, **kwargs) for w in self.workers]
        return [await ref for ref in refs]

    async def call_sharded(self, method: str, shards: Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Rank r gets `shards[r]` as its first argument."""
        if len(shards) != self.world_size:
            raise ValueError(f"{self.name}: {len(shards)} shards for {self.world_size} ranks")
        if not self._ready:
            await self.ready()
        refs = [getattr(w, method).remote(shard, *args, **kwargs) for w, shard in zip(self.workers, shards)]
        return [await ref for ref in refs]

    async def call_each(self, method: str, per_rank_args: Sequence[tuple]) -> list[Any]:
        """Rank r runs `method(*per_rank_args[r])`; results in rank order."""
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"{self.name}: {len(per_rank_args)} argument tuples for {self.world_size} ranks")
        if not self._ready:
            await self.ready()
        refs = [getattr(w, method).remote(*args) for w, args in zip(self.workers, per_rank_args)]
        return [await ref for ref in refs]

    def submit(self, rank: int, method: str, *args: Any) -> Any:
        """Queue `method(*args)` on rank `rank` without waiting; calls to one rank run in the order
        they were submitted. Returns the ObjectRef (awaitable). The group must be ready (a first
        `call` has run)."""
        if not self._ready:
            raise RuntimeError(f"{self.name}: submit before the group is ready; `await group.ready()` first")
        return getattr(self.workers[rank], method).remote(*args)

    async def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if not self._ready:
            await self.ready()
        return await getattr(self.workers[0], method).remote(*args, **kwargs)

    def kill(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
