"""ActorFwd / Reference role: forward-only log-probs written back onto the step's rows.

As Reference it loads `--ref-load` (default `--hf-checkpoint`) once and writes
`ref_log_probs`; in colocate mode the Controller calls `forward(step)` for the whole step.
In fully-async mode both roles run `run(start, end)`: they stream over each step's partition,
scoring rows as soon as Rollout has written them. ActorFwd writes `log_probs` (the old-policy
log-probs the Actor's PPO ratio divides by) with the actor's weights, which it receives over
the same broadcast group as the engines; it scores a row only once it holds weights at least
as new as the ones that generated the row.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from relax.components.actor import make_worker_group, shard_rows
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.distributed.checkpoint_service.transports import RayEndpoint
from relax.utils.logging import setup_logging

COLUMN = {"reference": "ref_log_probs", "actor_fwd": "log_probs"}
POLL_SECONDS = 0.02


def balanced_shards(n: int, world: int) -> list[list[int]]:
    """Row indices per rank, contiguous, sizes differing by at most one."""
    base, extra = divmod(n, world)
    out, start = [], 0
    for r in range(world):
        size = base + (1 if r < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


class ActorFwd:
    def __init__(self, cfg: RelaxConfig, role: str = "reference") -> None:
        setup_logging()
        if role not in COLUMN:
            raise ValueError(f"ActorFwd role must be one of {sorted(COLUMN)}, got {role!r}")
        self.cfg, self.role = cfg, role
        self.column = COLUMN[role]
        self.group = None
        self.stopping = False
        self.compute_seconds = 0.0

    async def setup(self) -> dict[str, Any]:
        tq.attach()
        model_path = self.cfg.ckpt.ref_load or self.cfg.ckpt.hf_checkpoint
        n = (self.cfg.cluster.resource.get(self.role) or [1, 1])[1] or 1
        overrides = self.cfg.cluster.ref_actor_config or {}
        self.group = make_worker_group(self.cfg, "reference", model_path, n,
                                       threads=overrides.get("threads"), name=self.role)
        return {}

    def receivers(self) -> list[RayEndpoint]:
        """This role's ranks as weight receivers (ActorFwd takes every actor update)."""
        return [RayEndpoint(w, f"{self.role}[{r}]") for r, w in enumerate(self.group.workers)]

    async def _log_probs(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]:
        shards_idx = [idx for idx in balanced_shards(len(tokens), self.group.world_size)]
        shards = [{"tokens": [tokens[i] for i in idx], "response_lengths": [lengths[i] for i in idx]}
                  for idx in shards_idx]
        results = await self.group.call_sharded("compute_log_probs", shards)
        self.compute_seconds += max(await self.group.call("pop_compute_seconds"))
        logps: list[list[float]] = [[] for _ in tokens]
        for idx, res in zip(shards_idx, results):
            for i, lp in zip(idx, res):
                logps[i] = lp
        return logps

    async def forward(self, rollout_id: int) -> dict[str, float]:
        """Colocate: score every row of the step at once."""
        start = time.perf_counter()
        keys = await tq.list_keys(rollout_id)
        cols = await tq.get_columns(rollout_id, keys, ["tokens", "response_lengths"])
        logps = await self._log_probs([t.tolist() for t in cols["tokens"]], cols["response_lengths"].tolist())
        await tq.put_columns(rollout_id, keys, {self.column: tq.sequence_column(logps)})
        compute, self.compute_seconds = self.compute_seconds, 0.0
        return {f"time/{self.role}": time.perf_counter() - start, f"compute/{self.role}_seconds": compute}

    # ---- fully async -------------------------------------------------------------------
    async def run(self, start: int, end: int) -> None:
        """Stream over steps `start..end-1`: score rows as Rollout writes them."""
        chunk = self.cfg.rollout.n_samples_per_prompt
        fields = ["tokens", "response_lengths", "weight_versions"]
        for step in range(start, end):
            done = 0
            while not self.stopping and self.group is not None:
                total = await tq.step_rows(step)
                want = chunk if total is None else max(1, min(chunk, total - done))
                keys, cols = await tq.fetch_ready(step, fields, task=self.role, chunk=want)
                if keys:
                    if self.role == "actor_fwd":
                        await self._wait_weights(max(int(v) for v in cols["weight_versions"]))
                    logps = await self._log_probs([t.tolist() for t in cols["tokens"]],
                                                  [int(x) for x in cols["response_lengths"]])
                    await tq.put_columns(step, keys, {self.column: tq.sequence_column(logps)})
                    done += len(keys)
                    continue
                if total is not None and done >= total:
                    break
                await asyncio.sleep(POLL_SECONDS)

    async def _wait_weights(self, version: int) -> None:
        while not self.stopping:
            held = await self.group.call_rank0("weight_version")
            if held is not None and held >= version:
                return
            await asyncio.sleep(POLL_SECONDS)

    def pop_compute_seconds(self) -> float:
        value, self.compute_seconds = self.compute_seconds, 0.0
        return value

    async def shutdown(self) -> None:
        self.stopping = True
        if self.group is not None:
            await self.group.call("shutdown")
            self.group.kill()
            self.group = None
