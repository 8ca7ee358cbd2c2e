"""ActorFwd / Reference role: forward-only log-probs written back onto the step's rows.

As Reference it loads `--ref-load` (default `--hf-checkpoint`; with `--ref-ckpt-step N`, step N of
the checkpoint directory `--ref-load` names, over `--hf-checkpoint`'s model) once and writes
`ref_log_probs` for every row of partition `train_{step}`, which the Actor reads for the KL
loss. With `--ref-update-interval N` it takes the actor's weights every N-th version, pushed
through the DCS coordinator like ActorFwd's (a lane of its own: `weight_receivers`), and scores
step s = kN only once it holds version s (the weights after training step s - 1; a resumed run's
first push brings them too).

When the plan streams it (fully async), Reference and ActorFwd run `run(start, end)`: they
stream over each step's partition, scoring rows as soon as Rollout has written them. ActorFwd
writes `old_log_probs` (the old-policy log-probs the Actor's PPO ratio divides by) with the
actor's weights, which it receives over the same broadcast group as the engines; it scores a
row only once it holds weights at least as new as the ones that generated the row (with
--keep-old-actor its ranks keep the last --max-staleness + 1 versions and score each row on its
own). Which column it writes and whether it receives weights is its part of the plan (`RolePlan`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable

from relax.components.setup_context import SetupContext
from relax.components.step_advantages import jagged
from relax.components.training import (
    initial_model, make_trainer_group, read_routing, read_rows, reference_step, score_rows,
)
from relax.config.layouts import scorer_config
from relax.config.plan import RolePlan
from relax.config.role_plans import StepPart
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.distributed.checkpoint_service.coordinator import Receivers, lane_due
from relax.distributed.weights.endpoints import RayEndpoint
from relax.types import MEDIA_COLUMN, ROUTING_COLUMN
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
        tq.start_replica()
        if len(plan.writes) != 1:
            raise ValueError(f"{plan.name}: ActorFwd writes one log-prob column, the plan gives {plan.writes}")
        self.cfg, self.plan, self.role = cfg, plan, plan.name
        self.column = plan.writes[0]
        # Old log-probs (ActorFwd): every weight version, each row scored on weights at least as
        # new as its own. Otherwise (the Reference) every `weights_every`-th version when the plan
        # says it receives weights, and a step due for a refresh scored on that step's version.
        self.per_row = self.column == "old_log_probs"
        receives = StepPart.RECEIVES_WEIGHTS in plan.parts
        self.refresh_every = plan.weights_every if receives and not self.per_row else 0
        self.group = None
        self.kept_versions = 0  # weight versions the ranks keep (`start`)
        self.stopping = False
        self.compute_seconds = 0.0

    async def start(self) -> None:
        overrides = self.cfg.cluster.ref_actor_config or {}
        # --ref-actor-config: their own layout and token budget (relax.config.layouts.scorer_config)
        # ActorFwd takes the actor's weights: with --lora-rank its model carries the pushed adapters.
        self.group = make_trainer_group(scorer_config(self.cfg), self.plan, initial_model(self.cfg), trainable=False,
                                        threads=overrides.get("threads"), adapters=self.per_row)
        await self.group.ready()  # weight_receivers() hands out these ranks: they must be the final ones
        self.kept_versions = self.group.spec.keep_weights  # --keep-old-actor: rows on their own version
        step = None if self.per_row else reference_step(self.cfg)
        if step is not None:  # --ref-ckpt-step: that step's weights over --hf-checkpoint's model
            await self.group.load_weights(str(step))
            logger.info("%s loaded the weights of %s", self.role, step)

    async def offload(self) -> dict[str, float]:
        """Colocate on shared GPUs: this role's ranks move their state to the host (rollout runs)."""
        return await self.group.move(to_host=True)

    async def onload(self) -> dict[str, float]:
        return await self.group.move(to_host=False)

    async def setup(self, ctx: SetupContext) -> SetupContext:
        return ctx

    async def weight_receivers(self) -> Receivers:
        """This role's ranks as weight receivers, with the GPU each holds its weights on (empty on
        CPU: the sender reaches ranks on its own GPU by CUDA IPC) and the cadence they take them at."""
        endpoints = [RayEndpoint(w, f"{self.role}[{r}]") for r, w in enumerate(self.group.workers)]
        devices = [(gpu,) if gpu else () for gpu in await self.group.gpu_identities()]
        return Receivers(endpoints, devices, every=1 if self.per_row else self.refresh_every)

    def _refreshed_at(self, step: int) -> bool:
        """The Reference scores step `step` on the actor's weights of version `step`."""
        return self.refresh_every > 0 and lane_due(self.refresh_every, step)

    async def _log_probs(self, tokens: list[list[int]], lengths: list[int], media: list[bytes] | None = None,
                         routing: list[bytes] | None = None, versions: list[int] | None = None) -> list[list[float]]:
        """`versions` (--keep-old-actor): each row scored on the ranks' copy of its own weight version."""
        out: list[list[float]] = [[] for _ in tokens]
        for version in sorted(set(versions)) if versions is not None else [None]:
            idx = [i for i, v in enumerate(versions) if v == version] if versions is not None else range(len(tokens))
            pick = lambda column: None if column is None else [column[i] for i in idx]  # noqa: E731
            logps, compute = await score_rows(self.group, pick(tokens), pick(lengths), pick(media), pick(routing),
                                              weights_version=version)
            self.compute_seconds += compute
            for i, lp in zip(idx, logps):
                out[i] = lp
        return out

    async def forward(self, rollout_id: int) -> dict[str, float]:
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if self._refreshed_at(rollout_id):  # pushed after the Actor trained the step before
            await self._wait_weights(rollout_id)
            metrics["reference/updated"] = 1.0
        keys, tokens, lengths, media = await read_rows(rollout_id, media=MEDIA_COLUMN in self.plan.reads)
        routing = await read_routing(rollout_id, keys) if ROUTING_COLUMN in self.plan.reads else None  # R3
        async with self.group.profiled_step():  # a step of the ranks' profilers (--use-pytorch-profiler)
            logps, compute = await score_rows(self.group, tokens, lengths, media, routing)
        await tq.put_columns(rollout_id, keys, {self.column: jagged(logps)})
        return metrics | {f"time/{self.role}": time.perf_counter() - start, f"compute/{self.role}_seconds": compute}

    # ---- fully async -------------------------------------------------------------------
    async def run(self, start: int, end: int) -> None:
        """Stream over steps `start..end-1`: score rows as Rollout writes them."""
        async def score(step: int, keys: list[str], cols: dict[str, Any]) -> None:
            versions = [int(v) for v in cols["weight_versions"]] if self.per_row else None
            if versions:  # old log-probs: on weights at least as new as the row's (or kept: its own)
                await self._wait_weights(max(versions))
            logps = await self._log_probs([t.tolist() for t in cols["tokens"]],
                                          [int(x) for x in cols["response_lengths"]],
                                          tq.media_bytes(cols.get(MEDIA_COLUMN)),
                                          tq.media_bytes(cols.get(ROUTING_COLUMN)),  # R3: the engines' routing
                                          versions if self.kept_versions else None)
            await tq.put_columns(step, keys, {self.column: tq.sequence_column(logps)})

        alive = lambda: not self.stopping and self.group is not None  # noqa: E731
        for step in range(start, end):
            if not alive():
                return
            if self._refreshed_at(step):  # --ref-update-interval: this step on the actor's weights
                await self._wait_weights(step)
            async with self.group.profiled_step():  # the step's scoring, for the ranks' profilers
                await tq.stream_step(step, task=self.role, chunk=self.cfg.rollout.n_samples_per_prompt,
                                     fields=[c for c in self.plan.reads if c != "sample_indices"], alive=alive,
                                     score=lambda keys, cols, step=step: score(step, keys, cols))

    async def _wait_weights(self, version: int) -> None:
        backoff = Backoff(max_s=0.05)
        while not self.stopping:
            held = await self.group.weight_version()
            if held is not None and held >= version:
                return
            await backoff.wait()

    def pop_compute_seconds(self) -> float:
        value, self.compute_seconds = self.compute_seconds, 0.0
        return value

    async def shutdown(self) -> None:
        self.stopping = True
        if self.group is not None:
            group, self.group = self.group, None
            await group.shutdown()
