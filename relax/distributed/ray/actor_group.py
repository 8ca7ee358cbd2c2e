"""A facade over N Ray actors that form one training group (data- and model-parallel ranks).

The group fans a remote call out to every rank (`on_all`) or hands each data-parallel shard
its own argument (`on_shards`) and gathers the results; a call is a function of the rank's
actor handle (`lambda w: w.push_weights.remote(v)`), never a method name in a string, so a
typed facade over the group (`relax.backends.trainer.group.TrainerGroup`) reads like the class
it drives.

The group's torch.distributed rendezvous port is picked in this process and bound seconds
later by rank 0, so another process may take it in between (EADDRINUSE). The first call on the
group waits for every rank to come up and, on that error, starts the ranks again on a new port.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Sequence

import ray

from relax.utils.net import free_port

logger = logging.getLogger(__name__)

PORT_ATTEMPTS = 3

RankCall = Callable[[Any], Any]  # a rank's actor handle -> the ObjectRef of one remote method call
ShardCall = Callable[[Any, Any], Any]  # (handle, the shard's argument) -> ObjectRef


def _port_taken(exc: BaseException) -> bool:
    text = str(exc)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


class RayActorGroup:
    """`world_size` instances of `worker_cls` (a plain class), each a Ray actor process.

    Every worker is constructed as `worker_cls(rank, world_size, master_addr, master_port,
    *args)` so it can join one torch.distributed group.

    Data parallelism: a worker with `parallel_info()` (the training backends) says which
    data-parallel shard it serves and whether it answers for it; the ranks of one model-parallel
    group (Megatron tensor/pipeline parallelism) receive the same shard. `dp_size` shards go in
    (`on_shards`, `submit`) and one result per shard comes back, in shard order.
    Without model parallelism every rank is its own shard.
    """

    def __init__(self, worker_cls: type, world_size: int, *args: Any, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, env_vars: dict[str, str] | None = None, name: str = "worker",
                 rank_options: Sequence[dict[str, Any]] | None = None) -> None:
        """`rank_options`: per rank, Ray options that place it (`relax.distributed.ray.placement.on_bundle`:
        its GPU share in the run's placement group); they replace `num_gpus`."""
        remote_cls = ray.remote(worker_cls)
        # RELAX_WORKER_GROUP names the group in each rank's environment (which role a process serves).
        runtime_env = {"env_vars": {**dict(env_vars or {}), "RELAX_WORKER_GROUP": name}}
        self.world_size = self.dp_size = world_size
        self._members: list[list[int]] = [[r] for r in range(world_size)]  # shard -> its ranks
        self._answers: list[int] = list(range(world_size))  # shard -> the rank whose result is returned
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
                await self._read_layout()
                self._ready = True
                return
            except ray.exceptions.RayActorError as exc:
                if not _port_taken(exc) or attempt == PORT_ATTEMPTS:
                    raise
                logger.warning("%s: rendezvous port taken by another process; restarting its %d ranks on a new "
                               "port (attempt %d of %d)", self.name, self.world_size, attempt + 1, PORT_ATTEMPTS)
                self.kill()
                self.workers = self._start(free_port())

    async def _read_layout(self) -> None:
        if not hasattr(self.workers[0], "parallel_info"):
            return
        infos = [await w.parallel_info.remote() for w in self.workers]
        self.dp_size = infos[0]["dp_size"]
        self._members = [[r for r, i in enumerate(infos) if i["dp_rank"] == d] for d in range(self.dp_size)]
        self._answers = [next(r for r in ranks if infos[r]["output"]) for ranks in self._members]

    async def _ensure_ready(self) -> None:
        if not self._ready:
            await self.ready()

    async def _answer(self, shard: int, refs: list[Any]) -> Any:
        results = [await ref for ref in refs]  # every rank of the shard finishes (errors surface)
        return results[self._members[shard].index(self._answers[shard])]

    async def on_all(self, call: RankCall) -> list[Any]:
        """`call(worker)` (a remote method call, e.g. `lambda w: w.shutdown.remote()`) on every
        rank; results in rank order."""
        await self._ensure_ready()
        refs = [call(w) for w in self.workers]
        return [await ref for ref in refs]

    async def on_shards(self, call: ShardCall, shards: Sequence[Any]) -> list[Any]:
        """Data-parallel shard d's ranks run `call(worker, shards[d])`; one result per shard, in
        shard order (the answering rank's)."""
        await self._ensure_ready()
        if len(shards) != self.dp_size:
            raise ValueError(f"{self.name}: {len(shards)} shards for {self.dp_size} data-parallel ranks")
        refs = [[call(self.workers[r], shard) for r in ranks] for ranks, shard in zip(self._members, shards)]
        return [await self._answer(d, r) for d, r in enumerate(refs)]

    def submit(self, shard: int, call: RankCall) -> Any:
        """Queue `call(worker)` on shard `shard`'s ranks without waiting; calls to one rank run in
        the order they were submitted. Returns an awaitable of the shard's result. The group must
        be ready (a first call has run)."""
        if not self._ready:
            raise RuntimeError(f"{self.name}: submit before the group is ready; `await group.ready()` first")
        refs = [call(self.workers[r]) for r in self._members[shard]]
        return asyncio.ensure_future(self._answer(shard, refs))

    async def on_rank0(self, call: RankCall) -> Any:
        await self._ensure_ready()
        return await call(self.workers[0])

    def kill(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
