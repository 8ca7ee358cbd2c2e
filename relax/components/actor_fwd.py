"""ActorFwd / Reference role: forward-only log-probs written back onto the step's rows.

As Reference it loads `--ref-load` (default `--hf-checkpoint`) once and writes
`ref_log_probs` for every row of partition `train_{step}`, which the Actor reads for the KL
loss. With `--ref-update-interval N` it takes the actor's weights before scoring every N-th
step (the Actor saves them to `reference_sync_dir` after training the step before; on a
resumed run the reference starts from `--ref-load` again until its next refresh).

When the plan streams it (fully async), Reference and ActorFwd run `run(start, end)`: they
stream over each step's partition, scoring rows as soon as Rollout has written them. ActorFwd
writes `old_log_probs` (the old-policy log-probs the Actor's PPO ratio divides by) with the
actor's weights, which it receives over the same broadcast group as the engines; it scores a
row only once it holds weights at least as new as the ones that generated the row. Which
column it writes and whether it receives weights is its part of the plan (`RolePlan`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from relax.components.step_advantages import jagged
from relax.components.training import (
    make_worker_group, move_ranks, read_rows, ref_update_due, reference_sync_dir, score_rows,
)
from relax.config.plan import RolePlan
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.distributed.checkpoint_service.transports import RayEndpoint
from relax.types import MEDIA_COLUMN
from relax.utils.logging import setup_logging
from relax.utils.poll import Backoff

logger = logging.getLogger(__name__)


async def stream_steps(start: int, end: int, *, task: str, chunk: int, fields: list[str],
                       score: Callable[[int, list[str], dict[str, Any]], Awaitable[None]],
                       alive: Callable[[], bool]) -> None:
    """Fully async: `tq.stream_step` over steps `start..end-1`, handing `score(step, keys, cols)`
    every row as soon as its `fields` are written. Shared by ActorFwd, Reference, Teacher and Critic."""
    for step in range(start, end):
        if not alive():
            return
        await tq.stream_step(step, task=task, chunk=chunk, fields=fields, alive=alive,
                             score=lambda keys, cols, step=step: score(step, keys, cols))


class ActorFwd:
    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        setup_logging()
        tq.attach_if_running()  # here, not in setup: replicas construct side by side (~1 s per process)
        if len(plan.writes) != 1:
            raise ValueError(f"{plan.name}: ActorFwd writes one log-prob column, the plan gives {plan.writes}")
        self.cfg, self.plan, self.role = cfg, plan, plan.name
        self.column = plan.writes[0]
        self.group = None
        self.stopping = False
        self.compute_seconds = 0.0

    async def start(self) -> None:
        model_path = self.cfg.ckpt.ref_load or self.cfg.ckpt.hf_checkpoint
        overrides = self.cfg.cluster.ref_actor_config or {}
        self.group = make_worker_group(self.cfg, self.plan, "reference", model_path, threads=overrides.get("threads"))
        await self.group.ready()  # weight_receivers() hands out these ranks: they must be the final ones

    async def offload(self) -> dict[str, float]:
        """Colocate on shared GPUs: this role's ranks move their state to the host (rollout runs)."""
        return await move_ranks(self.group, "offload")

    async def onload(self) -> dict[str, float]:
        return await move_ranks(self.group, "onload")

    async def setup(self, context: dict[str, Any]) -> dict[str, Any]:
        return {}

    def weight_receivers(self) -> list[RayEndpoint]:
        """This role's ranks as weight receivers (ActorFwd takes every actor update)."""
        return [RayEndpoint(w, f"{self.role}[{r}]") for r, w in enumerate(self.group.workers)]

    async def receiver_devices(self) -> list[tuple[str, ...]]:
        """Per rank, the GPU it holds its weights on (empty on CPU): the sender reaches ranks on
        its own GPU by CUDA IPC."""
        return [(gpu,) if gpu else () for gpu in await self.group.call("gpu_identity")]

    async def _log_probs(self, tokens: list[list[int]], lengths: list[int], media: list[bytes] | None = None
                         ) -> list[list[float]]:
        logps, compute = await score_rows(self.group, tokens, lengths, "compute_log_probs", media)
        self.compute_seconds += compute
        return logps

    async def forward(self, rollout_id: int) -> dict[str, float]:
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.role == "reference" and ref_update_due(self.cfg, rollout_id):
            metrics |= await self._take_actor_weights(rollout_id)
        keys, tokens, lengths, media = await read_rows(rollout_id, media=MEDIA_COLUMN in self.plan.reads)
        logps, compute = await score_rows(self.group, tokens, lengths, "compute_log_probs", media)
        await tq.put_columns(rollout_id, keys, {self.column: jagged(logps)})
        return metrics | {f"time/{self.role}": time.perf_counter() - start, f"compute/{self.role}_seconds": compute}

    async def _take_actor_weights(self, rollout_id: int) -> dict[str, float]:
        path = Path(reference_sync_dir(self.cfg))
        marker = path / "for_step.txt"
        if not marker.is_file() or int(marker.read_text()) != rollout_id:
            logger.warning("step %d: no actor weights saved for the reference in %s (a resumed run?); the "
                           "reference keeps its current weights until the next refresh", rollout_id, path)
            return {}
        await self.group.call("load_weights", str(path))
        logger.info("step %d: the reference took the actor's weights", rollout_id)
        return {"reference/updated": 1.0}

    # ---- fully async -------------------------------------------------------------------
    async def run(self, start: int, end: int) -> None:
        """Stream over steps `start..end-1`: score rows as Rollout writes them."""
        async def score(step: int, keys: list[str], cols: dict[str, Any]) -> None:
            if self.plan.receives_weights:  # old log-probs: on weights at least as new as the row's
                await self._wait_weights(max(int(v) for v in cols["weight_versions"]))
            logps = await self._log_probs([t.tolist() for t in cols["tokens"]],
                                          [int(x) for x in cols["response_lengths"]],
                                          tq.media_bytes(cols.get(MEDIA_COLUMN)))
            await tq.put_columns(step, keys, {self.column: tq.sequence_column(logps)})

        alive = lambda: not self.stopping and self.group is not None  # noqa: E731
        for step in range(start, end):
            if not alive():
                return
            # --ref-update-interval: the Actor saves its weights for this step after training the
            # one before (on a resumed run the first step keeps the reference's current weights).
            if self.role == "reference" and step > start and ref_update_due(self.cfg, step):
                await self._wait_actor_weights(step)
            await tq.stream_step(step, task=self.role, chunk=self.cfg.rollout.n_samples_per_prompt,
                                 fields=[c for c in self.plan.reads if c != "sample_indices"], alive=alive,
                                 score=lambda keys, cols, step=step: score(step, keys, cols))

    async def _wait_actor_weights(self, step: int) -> None:
        """Fully async: wait for the Actor's save for `step` (its marker), then load it."""
        marker, backoff = Path(reference_sync_dir(self.cfg)) / "for_step.txt", Backoff(max_s=0.2)
        while not self.stopping:
            if marker.is_file() and marker.read_text() == str(step):
                await self._take_actor_weights(step)
                return
            await backoff.wait()

    async def _wait_weights(self, version: int) -> None:
        backoff = Backoff(max_s=0.05)
        while not self.stopping:
            held = await self.group.call_rank0("weight_version")
            if held is not None and held >= version:
                return
            await backoff.wait()

    def pop_compute_seconds(self) -> float:
        value, self.compute_seconds = self.compute_seconds, 0.0
        return value

    async def shutdown(self) -> None:
        self.stopping = True
        if self.group is not None:
            await self.group.call("shutdown")
            self.group.kill()
            self.group = None
