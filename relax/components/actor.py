"""Actor role: trains the policy on each step's TransferQueue partition and pushes weights.

What it does per step is its part of the run plan (`relax.config.plan.ActorPlan`), decided
once: which columns it reads, which it computes itself, its loader, whether it clears the
partition. Per step: load the rows into a `TrainBatch` (in sample order, so groups are
contiguous), reject rows whose weight version lags more than `--max-staleness`, run
`--num-iters-per-train-update` passes of `rollout_batch / global_batch` optimizer steps over the
data-parallel ranks, then leave `returns` for a critic or clear the partition.

Loaders: the whole-step loader (colocate) reads a complete step and computes old log-probs on
the current weights (--keep-old-actor: on the ranks' copy of the weights the engines generated the
rows with) and the advantages (`step_advantages`) itself; the streaming loader (fully
async) plans the pass as soon as Rollout has written the step and feeds each rank its rows as
ActorFwd, Reference and Advantages complete them, so micro-batches train while later rows are
still scored. Both compute exactly the same optimizer steps.

During --num-critic-only-steps / --critic-train-only the actor takes no optimizer step.
Weights go out through the DCS coordinator to every receiver it lists (the engines; ActorFwd's
ranks in fully-async mode; the Reference every --ref-update-interval steps), overlapping the next
step when the plan says so (`relax.components.weight_publisher`). Training, pushes and restores
take turns on the ranks. With --debug-rollout-only the plan deploys `UntrainedActor` instead: no
ranks, it consumes each step untrained and only advances the weight version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any

import torch

from relax.backends.trainer.group import ScoreShard, TrainerGroup
from relax.components.setup_context import SetupContext
from relax.components.step_advantages import AdvantageSpec, final_rows, jagged, opd_metrics, step_advantages
from relax.components.training import (
    CheckpointPart, balance_lengths, initial_model, make_trainer_group, mean_over_ranks, optimizer_steps_total,
    step_plan, train_on_rows, trains_actor,
)
from relax.components.train_hooks import load_postprocess, postprocess_rows
from relax.components.weight_publisher import WeightPublisher
from relax.config.fault import recovery_window_s
from relax.config.plan import ActorPlan
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.types import COLUMNS, ROLLOUT_COLUMNS, TrainBatch
from relax.utils import checkpoints
from relax.utils.logging import run_token
from relax.utils.poll import Backoff

logger = logging.getLogger(__name__)


class Actor:
    def __init__(self, cfg: RelaxConfig, plan: ActorPlan) -> None:
        tq.start_replica()
        self.cfg, self.plan = cfg, plan
        self.token = run_token()
        self.version = 0  # weight version the engines hold (= optimizer updates applied)
        self.params_version = 0  # weight version the ranks hold (ahead of `version` between train and push)
        self.row_versions: list[int] = []  # the weight versions of the step being trained (`_read_batch`)
        self._ranks = asyncio.Lock()  # one of train / push / restore on the ranks at a time
        self.group: TrainerGroup | None = None  # `start`
        self.ckpt: CheckpointPart | None = None  # `start`
        self.weights: WeightPublisher | None = None
        self.advantages = AdvantageSpec.from_config(cfg)
        self._first_pass = {"whole_step": self._whole_step_pass, "streaming": self._streaming_pass}[plan.loader]
        self.postprocess = load_postprocess(cfg.rollout.rollout_data_postprocess_path)

    async def start(self) -> None:
        """Start the ranks (every role starts its processes at once, before the setups)."""
        self.group = make_trainer_group(self.cfg, self.plan.role, initial_model(self.cfg),
                                        total_steps=optimizer_steps_total(self.cfg), adapters=True)
        await self.group.ready()
        self.ckpt = CheckpointPart(self.group, background=self.cfg.ckpt.async_save)
        window = recovery_window_s(self.cfg) if self.cfg.fault.use_fault_tolerance else None
        self.weights = WeightPublisher(self.group, self.plan, self.token, retry_window_s=window)

    async def setup(self, ctx: SetupContext) -> SetupContext:
        """Resume from `--load` when it holds a checkpoint. Publishes the first rollout id to run."""
        cfg = self.cfg
        start = 0
        point = checkpoints.resume_point(cfg.ckpt.load, fallback=cfg.ckpt.load_fallback) if cfg.ckpt.load else None
        if point is not None:
            if "actor" not in point.parts:
                raise checkpoints.CheckpointError(
                    f"--load {cfg.ckpt.load}: the checkpoint of step {point.rollout_id} has no actor part (a "
                    "--debug-rollout-only run saved it); load it with --debug-rollout-only or point --load elsewhere")
            ckpt = point.parts["actor"]
            meta = await self.group.load(str(ckpt))
            start = meta["rollout_id"] + 1
            logger.info("resumed from %s: next rollout %d", ckpt, start)
        if cfg.data.start_rollout_id is not None:
            start = cfg.data.start_rollout_id
        self.version = self.params_version = start
        # `resume`: the checkpoint's step, whose parts the other roles load (data position, critic)
        return dataclasses.replace(ctx, start_rollout_id=start, resume=point)

    # ---- weights out -------------------------------------------------------------------
    async def connect_dcs(self, coordinator: Any) -> None:
        """Weights go to whatever the DCS coordinator lists (engines, ActorFwd and Reference ranks)."""
        self.weights.connect(coordinator)

    async def update_weights(self, version: int) -> dict[str, float]:
        """Push weights to every receiver due; without receivers (replay) the version still
        advances, so staleness checks read the same as in a full run."""
        async with self._ranks:
            stats = await self.weights.push(version)
        self.version = self.params_version = version
        return stats

    def push_retries_count(self) -> int:
        """Weight pushes tried again after a receiver failed, so far (`relax.core.health` counts them)."""
        return self.weights.retries

    async def restore_weights(self, receivers: list[Any], devices: list[Any] | None = None) -> dict[str, float]:
        """Tier 1: push the weights the ranks hold now to `receivers` only (replacement engines,
        before they are routed to)."""
        async with self._ranks:
            return await self.weights.restore(receivers, devices, self.params_version)

    async def settle_weights(self) -> None:
        """Elastic scale-in: wait until no weight push is in flight (a synchronous one holds the ranks, a
        background one is waited for), so an engine that left the topology is not stopped mid-push."""
        async with self._ranks:
            await self.group.settle_weight_push()

    async def offload(self) -> dict[str, float]:
        """Colocate on shared GPUs: this role's ranks move their state to the host (rollout runs)."""
        return await self.group.move(to_host=True)

    async def onload(self) -> dict[str, float]:
        return await self.group.move(to_host=False)

    # ---- training ----------------------------------------------------------------------
    async def train(self, rollout_id: int) -> dict[str, float]:
        async with self._ranks, self.group.profiled_step():  # a step of the ranks' profilers (--use-pytorch-profiler)
            metrics = await self._train(rollout_id)
        self.params_version = rollout_id + 1
        return metrics

    async def _train(self, rollout_id: int) -> dict[str, float]:
        start = time.perf_counter()
        trains = trains_actor(self.cfg, rollout_id)
        keys, batch, metrics, results = await self._first_pass(rollout_id, trains)
        if batch.teacher_log_probs_RT is not None:  # OPD: how far the student still is from the teacher
            metrics |= opd_metrics(batch.old_log_probs_RT, batch.teacher_log_probs_RT, batch.loss_masks_RT)
        self._save_batch(rollout_id, batch)
        if trains:
            t0 = time.perf_counter()
            compute = max((r.pop("compute_seconds") for r in results or []), default=0.0)
            passes = int(results is not None)
            while passes < self.plan.passes:  # --num-iters-per-train-update: PPO epochs over the step
                results = await train_on_rows(self.group, batch, self.cfg.batch.global_batch_size,
                                              balance_lengths(self.cfg, batch))
                compute += max(r.pop("compute_seconds") for r in results)
                passes += 1
            metrics["train/passes"] = float(passes)
            if self.cfg.optim.reset_optimizer_states:  # the next step starts from a fresh optimizer state
                await self.group.reset_optimizer()
            if self.cfg.algo.use_routing_replay:  # the routing this step's first forward recorded (R2) is done
                await self.group.forget_routing()
            metrics["time/train_step"] = metrics.get("time/train_step", 0.0) + time.perf_counter() - t0
            # Ranks run in parallel: the slowest one's forward/backward/optimizer time is the compute.
            metrics["compute/train_seconds"] = compute
            metrics.update(mean_over_ranks(results, prefix="train"))
        else:
            metrics["train/critic_only_step"] = 1.0
        if "returns" in self.plan.writes:  # the critic trains on these returns and clears the partition
            await tq.put_columns(rollout_id, keys, {"returns": jagged(batch.returns_RT)})
        if self.plan.clears:
            await tq.clear(rollout_id)
        metrics["time/train"] = time.perf_counter() - start
        return metrics

    async def _whole_step_pass(self, rollout_id: int, trains: bool) -> tuple[list[str], TrainBatch,
                                                                           dict[str, float], list | None]:
        """Every row and column of the step is written: read it, compute what the plan leaves to
        the Actor (old log-probs, advantages and returns), run the first training pass."""
        start = time.perf_counter()
        keys, batch, metrics = await self._read_batch(rollout_id, self.plan.reads)
        metrics["time/wait_rows"] = time.perf_counter() - start
        t0 = time.perf_counter()
        needs_old = "old_log_probs" in self.plan.computes or self._needs_old_forward(batch)
        if needs_old or self.cfg.algo.use_rollout_entropy:  # --use-rollout-entropy: from the same forward
            old, batch.entropy_RT = await self._old_log_probs(batch)
            if needs_old:
                batch.old_log_probs_RT = old
        metrics["time/old_log_probs"] = time.perf_counter() - t0
        if "ref_log_probs" in self.plan.computes:  # --lora-rank: the base model, the adapter off
            t0 = time.perf_counter()
            batch.ref_log_probs_RT = await self._ref_log_probs(batch)
            metrics["time/ref_log_probs"] = time.perf_counter() - t0
        if "advantages" in self.plan.computes:
            batch.advantages_RT, returns_RT = step_advantages(
                self.advantages, batch.rewards_R, batch.loss_masks_RT, old_log_probs_RT=batch.old_log_probs_RT,
                ref_log_probs_RT=batch.ref_log_probs_RT, teacher_log_probs_RT=batch.teacher_log_probs_RT,
                values_RT=batch.values_RT, final_of_R=final_rows(batch.sample_indices_R, batch.episode_indices_R))
            if "returns" in self.plan.computes:
                batch.returns_RT = returns_RT
        if self.postprocess is not None:  # --rollout-data-postprocess-path: the step's rows before training
            postprocess_rows(self.postprocess, self.cfg.args, rollout_id, batch)
        results = None
        if trains:
            t0 = time.perf_counter()
            results = await train_on_rows(self.group, batch, self.cfg.batch.global_batch_size,
                                          balance_lengths(self.cfg, batch))
            metrics["time/train_step"] = time.perf_counter() - t0
        return keys, batch, metrics, results

    async def _streaming_pass(self, rollout_id: int, trains: bool) -> tuple[list[str], TrainBatch,
                                                                          dict[str, float], list | None]:
        """The first pass over step `rollout_id` while its rows are still being scored.

        Once Rollout has written every row (the micro-batch plan and the loss normalisers need
        all rows' lengths and masks), the ranks plan the pass (`train_begin`) and are fed each
        row as soon as ActorFwd, Reference and Advantages have completed it (`train_rows`); a
        micro-batch runs when all its rows are in, in the plan's order, so the pass computes
        exactly what a whole-step pass does. Without training (critic-only steps) it only waits
        until every row is complete."""
        start, backoff = time.perf_counter(), Backoff()
        while await tq.step_rows(rollout_id) is None:
            await backoff.wait()
        scored = [c for c in self.plan.reads if c not in ROLLOUT_COLUMNS]
        if not trains:
            await tq.stream_step(rollout_id, task="actor", chunk=self.cfg.rollout.n_samples_per_prompt,
                                 fields=scored, score=_ignore, alive=lambda: True)
            keys, batch, metrics = await self._read_batch(rollout_id, self.plan.reads)
            metrics["time/wait_rows"] = time.perf_counter() - start
            return keys, batch, metrics, None
        keys, batch, metrics = await self._read_batch(rollout_id, [c for c in self.plan.reads if c in ROLLOUT_COLUMNS])
        metrics["time/wait_rows"] = time.perf_counter() - start
        t0 = time.perf_counter()
        num_steps, shards_idx, tokens_per_step = step_plan(batch.loss_masks_RT, self.cfg.batch.global_batch_size,
                                                           self.group.dp_size, balance_lengths(self.cfg, batch))
        await self.group.train_begin([[len(batch.tokens_RL[i]) for i in idx] for idx in shards_idx],
                                     num_steps, tokens_per_step)
        where = {i: (rank, pos) for rank, idx in enumerate(shards_idx) for pos, i in enumerate(idx)}
        index = {key: i for i, key in enumerate(keys)}
        pending: list[tuple[int, Any]] = []  # (rank, ObjectRef of its train_rows call)

        async def feed(ready: list[str], cols: dict[str, Any]) -> None:
            rows = [index[k] for k in ready]
            part = batch.rows(rows)  # Rollout's columns of these rows, then the ones just completed
            for c in scored:
                setattr(part, COLUMNS[c].field, _cells(c, cols[c]))
            self._old_policy(part)
            batch.put(rows, part)
            per_rank: dict[int, list[tuple[int, int]]] = {}
            for j, i in enumerate(rows):
                if i in where:  # rows past the last full optimizer step are not trained
                    per_rank.setdefault(where[i][0], []).append((where[i][1], j))
            for rank, items in per_rank.items():
                pending.append((rank, self.group.train_rows(rank, [pos for pos, _ in items],
                                                            part.rows([j for _, j in items]))))

        await tq.stream_step(rollout_id, task="actor", chunk=self.cfg.rollout.n_samples_per_prompt, fields=scored,
                             score=feed, alive=lambda: True)
        ran = await asyncio.gather(*(ref for _, ref in pending))
        results = await self.group.train_end()
        # Micro-batches a rank ran before its last rows arrived: training overlapped with scoring.
        last = {rank: i for i, (rank, _) in enumerate(pending)}
        metrics["train/early_micro_batches"] = float(sum(n for i, n in enumerate(ran) if i != last[pending[i][0]]))
        metrics["time/train_step"] = time.perf_counter() - t0
        metrics["time/old_log_probs"] = 0.0  # ActorFwd's job in this plan
        return keys, batch, metrics, results

    def _needs_old_forward(self, batch: TrainBatch) -> bool:
        """The plan reuses the training forward's log-probs, but this step has more rows than one
        optimizer step takes (the steps after the first would see moved weights), or the batch is
        dumped (`--save-debug-train-data`, `--dump-details`: the dump holds the old log-probs):
        score them."""
        if self.plan.old_policy != "training_log_probs":
            return False
        if self.cfg.debug.save_debug_train_data or self.cfg.debug.dump_details:
            return True
        num_steps, _, _ = step_plan(batch.loss_masks_RT, self.cfg.batch.global_batch_size, self.group.dp_size)
        if num_steps > 1:
            logger.warning("%d rows make %d optimizer steps: old log-probs recomputed for this step",
                           len(batch.loss_masks_RT), num_steps)
        return num_steps > 1

    def _old_policy(self, batch: TrainBatch) -> None:
        """--use-rollout-logprobs: the engine's log-probs are the behaviour policy (the plan's choice)."""
        if self.plan.old_policy == "rollout_log_probs":
            batch.old_log_probs_RT = batch.rollout_log_probs_RT

    def _save_batch(self, rollout_id: int, batch: TrainBatch) -> None:
        """`--save-debug-train-data` / `--dump-details`: the exact batch the optimizer steps see,
        by column name (tokens, loss_masks, advantages, old_log_probs, ...)."""
        d = self.cfg.debug
        paths = [d.save_debug_train_data.format(rollout_id=rollout_id)] if d.save_debug_train_data else []
        if d.dump_details:
            paths.append(os.path.join(d.dump_details, "train", f"{rollout_id}.pt"))
        for path in paths:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            torch.save({"rollout_id": rollout_id, **batch.to_columns()}, path)

    async def _old_log_probs(self, batch: TrainBatch) -> tuple[list[list[float]], list[list[float]] | None]:
        """The behaviour policy's log-probs, recomputed on the current weights (sharded as training
        is), and with --use-rollout-entropy each token's entropy (else None)."""
        shards_idx, shards = self._score_shards(batch)
        entropy, kept = self.cfg.algo.use_rollout_entropy, self._kept_version()
        results = await (self.group.score_with_entropy(shards, kept) if entropy else self.group.score(shards, kept))
        old: list[list[float]] = [[] for _ in batch.tokens_RL]
        ents: list[list[float]] = [[] for _ in batch.tokens_RL]
        for idx, result in zip(shards_idx, results):
            logps, shard_ents = result if entropy else (result, [[] for _ in idx])
            for i, lp, ent in zip(idx, logps, shard_ents):
                old[i], ents[i] = lp, ent
        return old, ents if entropy else None

    def _kept_version(self) -> int | None:
        """--keep-old-actor (colocate, the engines a version or more behind the ranks): the weight version
        that generated the step's rows, which the ranks kept at its push (None: the ranks hold it)."""
        if not self.group.spec.keep_weights or self.row_versions == [self.params_version]:
            return None
        if len(self.row_versions) != 1:
            raise RuntimeError(f"--keep-old-actor: the step's rows come from weight versions {self.row_versions}, "
                               "but the ranks keep only the engines' last one (an engine replaced mid-step?)")
        return self.row_versions[0]

    def _score_shards(self, batch: TrainBatch) -> tuple[list[list[int]], list[ScoreShard]]:
        """The step's rows over the ranks as training shards them: row indices and scoring shards."""
        _, shards_idx, _ = step_plan(batch.loss_masks_RT, self.cfg.batch.global_batch_size, self.group.dp_size,
                                     balance_lengths(self.cfg, batch))
        media, routing = batch.multimodal_train_inputs_RB, batch.rollout_routed_experts_RB
        return shards_idx, [ScoreShard([batch.tokens_RL[i] for i in idx], [batch.response_lengths_R[i] for i in idx],
                                       None if media is None else [media[i] for i in idx],
                                       None if routing is None else [routing[i] for i in idx]) for idx in shards_idx]

    async def _ref_log_probs(self, batch: TrainBatch) -> list[list[float]]:
        """The Reference of a LoRA run: the base model's log-probs (every adapter off) on the actor's
        own ranks, sharded as training is."""
        shards_idx, shards = self._score_shards(batch)
        out: list[list[float]] = [[] for _ in batch.tokens_RL]
        for idx, logps in zip(shards_idx, await self.group.score_base(shards)):
            for i, lp in zip(idx, logps):
                out[i] = lp
        return out

    async def _read_batch(self, rollout_id: int, columns: list[str] | tuple[str, ...]) -> tuple[
            list[str], TrainBatch, dict[str, float]]:
        """The step's rows in key order (`columns` of them), after the staleness check."""
        keys = await tq.list_keys(rollout_id)
        cols = await tq.get_columns(rollout_id, keys, list(columns))
        lags = [self.version - v for v in cols["weight_versions"].tolist()]
        self.row_versions = sorted({int(v) for v in cols["weight_versions"].tolist()})  # (--keep-old-actor)
        stale = [i for i, lag in enumerate(lags) if lag > self.plan.max_staleness]
        metrics = {"train/max_version_lag": float(max(lags)), "train/rejected_stale_rows": float(len(stale))}
        if stale:  # the rollout gate makes this impossible; if it ever happens, say so loudly
            raise RuntimeError(f"rollout {rollout_id}: {len(stale)} rows lag more than --max-staleness "
                               f"{self.plan.max_staleness} weight versions behind the actor's {self.version} "
                               f"(max lag {max(lags)}); the engines missed a weight update")
        batch = TrainBatch.from_columns({name: _cells(name, cols[name]) for name in columns
                                         if name != "weight_versions"})
        self._old_policy(batch)
        return keys, batch, metrics

    async def save(self, rollout_id: int) -> dict[str, str]:
        """Write this step's actor part, or with --async-save start writing it (the Controller commits
        the checkpoint once `finish_save` has returned)."""
        cfg = self.cfg.ckpt
        async with self._ranks:
            return {"actor": await self.ckpt.save(cfg.save, rollout_id, save_optim=not cfg.no_save_optim)}

    async def finish_save(self) -> None:
        """--async-save: wait for the actor part being written and move it into place."""
        async with self._ranks:
            await self.ckpt.finish()

    async def export_hf(self, rollout_id: int) -> str | None:
        out = self.cfg.ckpt.save_hf.format(rollout_id=rollout_id)
        os.makedirs(out, exist_ok=True)
        async with self._ranks:
            await self.group.export_hf(out, self.cfg.ckpt.hf_checkpoint)
        return out

    async def shutdown(self) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            await group.shutdown()


class UntrainedActor:
    """The Actor of a --debug-rollout-only run (the plan deploys it: no ranks). Each step's rows are
    consumed untrained and the weight version advances as in a full run, so the Rollout's staleness
    gate reads the same; the engines keep the weights they started with."""

    def __init__(self, cfg: RelaxConfig, plan: ActorPlan) -> None:
        tq.start_replica()
        self.cfg, self.plan = cfg, plan
        self.version = 0

    async def setup(self, ctx: SetupContext) -> SetupContext:
        self.version = start = self.cfg.data.start_rollout_id or 0
        return dataclasses.replace(ctx, start_rollout_id=start)

    async def connect_dcs(self, coordinator: Any) -> None:
        """No ranks: nothing is pushed."""

    async def update_weights(self, version: int) -> dict[str, float]:
        self.version = version
        return {}

    def push_retries_count(self) -> int:
        return 0

    async def restore_weights(self, receivers: list[Any], devices: list[Any] | None = None) -> dict[str, float]:
        """Every engine keeps the weights it started with."""
        return {}

    async def settle_weights(self) -> None:
        """No weight pushes."""

    async def train(self, rollout_id: int) -> dict[str, float]:
        await tq.clear(rollout_id)
        return {}

    async def save(self, rollout_id: int) -> dict[str, str]:
        return {}

    async def finish_save(self) -> None:
        """Nothing is written."""

    async def export_hf(self, rollout_id: int) -> str | None:
        return None

    async def shutdown(self) -> None:
        """Nothing was started."""


def _as_list(value: Any) -> Any:
    """A fetched cell (tensor or plain value) as Python data."""
    return value.tolist() if hasattr(value, "tolist") else value


def _cells(name: str, values: Any) -> list[Any]:
    """A fetched column as Python data per row (the bytes columns, media and routing, as bytes)."""
    if COLUMNS[name].shape == "RB":
        return tq.media_bytes(values)
    return [_as_list(v) for v in values] if COLUMNS[name].ragged else values.tolist()


async def _ignore(keys: list[str], cols: dict[str, Any]) -> None:
    """A stream consumer that only waits for rows to complete."""
