"""Actor role: trains the policy on each step's TransferQueue partition and pushes weights.

Per step: read the partition (in sample order, so groups are contiguous), reject rows whose
weight version lags more than `--max-staleness`, recompute old log-probs on the current
weights, compute advantages (pure functions from `relax.algorithms`; GAE on the critic's
`values` for ppo, minus the OPD teacher penalty with --use-opd), run
`rollout_batch / global_batch` optimizer steps over the data-parallel workers, clear the
partition. The training backend is a Ray actor group resolved through the backend registry.

With a critic (ppo) the Actor writes the GAE `returns` onto the rows and leaves the partition
to the critic, which trains on them and clears it (the last consumer clears). During
--num-critic-only-steps / --critic-train-only it computes advantages and returns but takes no
optimizer step. With --ref-update-interval N it saves its weights for the reference after every
N-th step (see `reference_sync_dir`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from relax.algorithms.advantages import AdvantageInputs, apply_opd_penalty, compute_advantages, normalize_advantages
from relax.algorithms.kl import approx_kl
from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.backends.registry import TRAIN_BACKENDS
from relax.config.schema import OptimizerConfig, RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.distributed.ray.actor_group import RayActorGroup
from relax.utils.logging import run_token, setup_logging
from relax.utils.plugins import import_object
from relax.utils.poll import Backoff

logger = logging.getLogger(__name__)

# TransferQueue column -> the name the training workers read it by.
_TRAIN_NAMES = {"log_probs": "old_log_probs"}

# --advantage-estimator -> the policy loss it trains with.
ESTIMATOR_LOSS = {"gspo": "gspo", "sapo": "sapo"}


def policy_loss_config(cfg: RelaxConfig) -> PolicyLossConfig:
    a = cfg.algo
    return PolicyLossConfig(
        loss=ESTIMATOR_LOSS.get(a.advantage_estimator, "ppo"), eps_clip=a.eps_clip, eps_clip_high=a.eps_clip_high,
        eps_clip_c=a.eps_clip_c, sapo_tau_pos=a.sapo_tau_pos, sapo_tau_neg=a.sapo_tau_neg,
        use_kl_loss=a.use_kl_loss, kl_loss_coef=a.kl_loss_coef, kl_loss_type=a.kl_loss_type,
        use_unbiased_kl=a.use_unbiased_kl, entropy_coef=a.entropy_coef,
        per_token_loss=cfg.optim.calculate_per_token_loss, use_tis=a.use_tis, tis_clip=a.tis_clip,
        tis_clip_low=a.tis_clip_low, use_opsm=a.use_opsm, opsm_delta=a.opsm_delta,
        use_rollout_logprobs=a.use_rollout_logprobs,
    )


def make_worker_group(cfg: RelaxConfig, role: str, model_path: str, n_workers: int, *, total_steps: int = 1,
                      threads: int | None = None, name: str | None = None,
                      optim: OptimizerConfig | None = None) -> RayActorGroup:
    """The training-backend worker group for `role` ("actor" / "critic" train, "reference" only scores)."""
    worker_cls = import_object(TRAIN_BACKENDS[cfg.cluster.train_backend], flag="--train-backend")
    spec = TrainerSpec(
        model_path=model_path, role=role, optim=optim or cfg.optim, batch=cfg.batch, value_clip=cfg.algo.value_clip,
        loss=policy_loss_config(cfg) if role == "actor" else None, temperature=cfg.rollout.rollout_temperature,
        total_steps=total_steps, threads=threads or cfg.cluster.engine_threads,
        timeout_minutes=cfg.cluster.distributed_timeout_minutes, bucket_bytes=cfg.rollout.update_weight_buffer_size,
        sync_timeout_s=cfg.rollout.weight_sync_timeout, weight_sync_backend=cfg.ckpt.checkpoint_engine_backend,
        custom_loss_path=cfg.algo.custom_loss_function_path,
        pg_loss_reducer_path=cfg.algo.custom_pg_loss_reducer_function_path, tis_path=cfg.algo.custom_tis_function_path,
        true_on_policy=cfg.cluster.true_on_policy_mode,
    )
    gpus = 1.0 if torch.cuda.is_available() else 0.0
    return RayActorGroup(worker_cls, n_workers, spec, num_cpus=1, num_gpus=gpus, name=name or role,
                         env_vars={k: str(v) for k, v in cfg.misc.train_env_vars.items()})


def needs_reference(cfg: RelaxConfig) -> bool:
    """A reference model is deployed for the KL loss or KL reward shaping."""
    return cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0


def uses_critic(cfg: RelaxConfig) -> bool:
    """A critic (value model) is deployed for GAE advantages."""
    return cfg.algo.advantage_estimator == "ppo"


def needs_teacher(cfg: RelaxConfig) -> bool:
    """An OPD teacher scores every step's rows."""
    return cfg.algo.use_opd


def trains_actor(cfg: RelaxConfig, rollout_id: int) -> bool:
    """False while only the critic trains (--num-critic-only-steps, --critic-train-only)."""
    return not (cfg.algo.critic_train_only or rollout_id < cfg.algo.num_critic_only_steps)


def reference_sync_dir(cfg: RelaxConfig) -> str:
    """Where the Actor leaves its weights for the reference (--ref-update-interval)."""
    return os.path.join(cfg.misc.exp_dir or ".", "reference_sync")


def ref_update_due(cfg: RelaxConfig, rollout_id: int) -> bool:
    """The reference takes the actor's weights before scoring step `rollout_id` (every N steps)."""
    n = cfg.algo.ref_update_interval
    return bool(n) and rollout_id > 0 and rollout_id % n == 0


def optimizer_steps_total(cfg: RelaxConfig) -> int:
    """Optimizer steps of the whole run (the length of the LR schedule)."""
    per_rollout = cfg.rollout.rollout_batch_size * cfg.rollout.n_samples_per_prompt // cfg.batch.global_batch_size
    return per_rollout * (cfg.rollout.num_rollout or 1)


def jagged(rows: list[list[float]]) -> torch.Tensor:
    """Per-row float lists -> a jagged nested tensor column for TransferQueue."""
    return torch.nested.nested_tensor([torch.tensor(r, dtype=torch.float32) for r in rows], layout=torch.jagged)


def padded(rows: list[list[float]]) -> torch.Tensor:
    """Per-sample response-aligned lists -> right-padded `[B, T]` float tensor."""
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(r, dtype=torch.float32) for r in rows], batch_first=True)


def shard_rows(num_rows: int, num_steps: int, world_size: int) -> list[list[int]]:
    """Row indices per rank: each optimizer step's rows split evenly, step order kept."""
    per_step = num_rows // num_steps
    per_rank = per_step // world_size
    return [[s * per_step + r * per_rank + i for s in range(num_steps) for i in range(per_rank)]
            for r in range(world_size)]


def step_plan(loss_masks: list[list[int]], global_batch_size: int,
              world_size: int) -> tuple[int, list[list[int]], list[int]]:
    """How a step's rows train: (optimizer steps, row indices per rank, loss tokens per step)."""
    n_rows = len(loss_masks)
    num_steps = max(1, n_rows // global_batch_size)
    per_step = n_rows // num_steps
    tokens_per_step = [int(sum(sum(loss_masks[i]) for i in range(s * per_step, (s + 1) * per_step)))
                       for s in range(num_steps)]
    return num_steps, shard_rows(n_rows, num_steps, world_size), tokens_per_step


async def train_on_rows(group: RayActorGroup, batch: dict[str, Any], global_batch_size: int) -> list[dict[str, float]]:
    """`len(rows) / global_batch_size` optimizer steps of `group` over `batch` (per-row lists),
    sharded over its ranks; returns each rank's metrics."""
    num_steps, shards_idx, tokens_per_step = step_plan(batch["loss_masks"], global_batch_size, group.world_size)
    shards = [{k: [v[i] for i in idx] for k, v in batch.items() if isinstance(v, list)} for idx in shards_idx]
    return await group.call_sharded("train", shards, num_steps, tokens_per_step)


def opd_metrics(student_BT: torch.Tensor, teacher_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """The student's KL to the teacher: token mean of logp_student - logp_teacher on the student's
    own samples (a k1 estimate of KL(student || teacher) per token)."""
    tokens = mask_BT.sum().clamp(min=1)
    return {"opd/kl_to_teacher": float(((student_BT - teacher_BT) * mask_BT).sum() / tokens),
            "opd/teacher_log_prob_mean": float((teacher_BT * mask_BT).sum() / tokens)}


def batch_advantages(cfg: RelaxConfig, batch: dict[str, Any]) -> tuple[list[list[float]], list[list[float]], dict[str, float]]:
    """Per-row advantages and returns (response-aligned) of a step's batch, and the OPD metrics.

    The estimator (`--advantage-estimator`; GAE on `values` for ppo), then the OPD penalty on
    the old log-probs against `teacher_log_probs` (--use-opd), then --normalize-advantages.
    """
    a = cfg.algo
    mask_BT = padded(batch["loss_masks"])
    kl_BT = None
    if a.kl_coef != 0:  # reward shaping: k1 KL of the behaviour policy to the reference
        kl_BT = approx_kl(padded(batch["old_log_probs"]), padded(batch["ref_log_probs"]), "k1") * mask_BT
    inputs = AdvantageInputs(
        rewards_B=torch.tensor(batch["rewards"], dtype=torch.float32),
        n_samples_per_prompt=cfg.rollout.n_samples_per_prompt, mask_BT=mask_BT, kl_BT=kl_BT,
        kl_coef=a.kl_coef, gamma=a.gamma, lambd=a.lambd, std_normalization=not a.disable_grpo_std_normalization,
        # A custom reward post-process has already shaped the rewards: use them as they are.
        normalize_rewards=not (a.disable_rewards_normalization or cfg.reward.custom_reward_post_process_path),
        values_BT=padded(batch["values"]) if "values" in batch else None,
    )
    adv_BT, returns_BT = compute_advantages(a.advantage_estimator, inputs)
    metrics: dict[str, float] = {}
    if a.use_opd:  # the student's own (old) log-probs against the teacher's, per token
        student_BT, teacher_BT = padded(batch["old_log_probs"]), padded(batch["teacher_log_probs"])
        adv_BT = apply_opd_penalty(adv_BT, student_BT, teacher_BT, mask_BT, coef=a.opd_kl_coef)
        metrics = opd_metrics(student_BT, teacher_BT, mask_BT)
    if a.normalize_advantages:  # after the OPD penalty, as slime does: whiten the final advantage
        adv_BT = normalize_advantages(adv_BT, mask_BT)
    rows = [len(m) for m in batch["loss_masks"]]
    return ([adv_BT[i, :n].tolist() for i, n in enumerate(rows)],
            [returns_BT[i, :n].tolist() for i, n in enumerate(rows)], metrics)


class Actor:
    def __init__(self, cfg: RelaxConfig) -> None:
        setup_logging()
        self.cfg = cfg
        self.token = run_token()
        self.version = 0  # weight version the engines hold (= optimizer updates applied)
        self.group: RayActorGroup | None = None
        self.engines_connected = False
        self.dcs: Any = None  # fully async: the DCS coordinator's handle
        self.topology_version = -1
        self.pushed = False

    async def setup(self) -> dict[str, Any]:
        """Start the workers; resume from `--load` when it holds a checkpoint. Returns the
        first rollout id to run."""
        tq.attach()
        cfg = self.cfg
        total = optimizer_steps_total(cfg)
        start = 0
        if cfg.debug.debug_rollout_only:  # no training: no workers; engines keep their weights
            self.version = start = cfg.data.start_rollout_id or 0
            return {"start_rollout_id": start}
        model_path = cfg.ckpt.ref_load or cfg.ckpt.hf_checkpoint
        self.group = make_worker_group(cfg, "actor", model_path, cfg.cluster.resource["actor"][1], total_steps=total)
        ckpt = latest_checkpoint(cfg.ckpt.load) if cfg.ckpt.load else None
        if ckpt is not None:
            meta = (await self.group.call("load", str(ckpt)))[0]
            start = meta["rollout_id"] + 1
            logger.info("resumed from %s: next rollout %d", ckpt, start)
        if cfg.data.start_rollout_id is not None:
            start = cfg.data.start_rollout_id
        self.version = start
        return {"start_rollout_id": start}

    async def connect_engines(self, engine_urls: list[str]) -> None:
        if self.group is not None and engine_urls:
            backend = (await self.group.call("connect_engines", engine_urls, self.token))[0]
            self.engines_connected = True
            logger.info("weight group with %d engine(s) over %s", len(engine_urls), backend)

    async def connect_dcs(self, coordinator: Any) -> None:
        """Fully async: weights go to whatever the DCS coordinator lists (engines, ActorFwd ranks)."""
        self.dcs = coordinator

    async def _sync_topology(self) -> dict[str, float]:
        """Rebuild the broadcast group when the coordinator's topology changed since the last push."""
        topology = await self.dcs.topology.remote()
        if topology["version"] == self.topology_version:
            return {}
        mode = "abort" if self.cfg.rollout.partial_rollout else "in_place"
        backend = (await self.group.call("connect_receivers", topology["endpoints"], self.token, mode))[0]
        self.topology_version = topology["version"]
        logger.info("weight group rebuilt for topology v%d over %s: %s", topology["version"], backend,
                    topology["roles"])
        return {"weight_sync/topology_version": float(topology["version"])}

    async def update_weights(self, version: int) -> dict[str, float]:
        """Push weights to the engines (and, fully async, to every DCS receiver); without engines
        (replay) or training (rollout-only) the version still advances, so staleness checks read
        the same as in a full run."""
        stats: dict[str, float] = {}
        if self.group is not None and self.dcs is not None:
            # After the first push, broadcasts overlap the next training step (the Rollout's
            # staleness gate and evaluation wait for the engines' version, not for this call).
            background, self.pushed = self.pushed, True
            stats = await self._sync_topology()
            stats |= (await self.group.call("push_weights", version, background))[0]
            if "weight_sync/version" in stats:  # the push that finished (the previous one when overlapped)
                await self.dcs.publish.remote(int(stats["weight_sync/version"]),
                                              {k.split("/")[-1]: v for k, v in stats.items()})
        elif self.engines_connected:
            stats = (await self.group.call("push_weights", version))[0]
        self.version = version
        return stats

    async def train(self, rollout_id: int) -> dict[str, float]:
        if self.group is None:  # --debug-rollout-only: consume the step's rows untrained
            await tq.clear(rollout_id)
            return {}
        start = time.perf_counter()
        trains = trains_actor(self.cfg, rollout_id)
        passes = self.cfg.cluster.num_iters_per_train_update if self.cfg.cluster.fully_async else 1
        results: list[dict[str, float]] = []
        if self.cfg.cluster.fully_async and trains:  # the first pass streams rows as they complete
            keys, batch, metrics, results = await self._stream_pass(rollout_id)
            passes -= 1
        else:
            if self.cfg.cluster.fully_async:
                await self._wait_rows(rollout_id)
            keys, batch, metrics = await self._read_batch(rollout_id)
            metrics["time/wait_rows"] = time.perf_counter() - start
            t0 = time.perf_counter()
            if "log_probs" in batch:  # fully async: ActorFwd wrote them
                batch["old_log_probs"] = batch.pop("log_probs")
            else:
                batch["old_log_probs"] = await self._old_log_probs(batch)
            metrics["time/old_log_probs"] = time.perf_counter() - t0
        if "advantages" not in batch:  # fully async: the Advantages role wrote them
            batch["advantages"], returns, adv_metrics = batch_advantages(self.cfg, batch)
            metrics |= adv_metrics
        elif needs_teacher(self.cfg):  # (and applied the OPD penalty); the KL is reported here
            metrics |= opd_metrics(padded(batch["old_log_probs"]), padded(batch["teacher_log_probs"]),
                                   padded(batch["loss_masks"]))
        self._save_batch(rollout_id, batch)
        if trains:
            t0 = time.perf_counter()
            compute = max((r.pop("compute_seconds") for r in results), default=0.0)
            for _ in range(passes):  # --num-iters-per-train-update: passes over the step's data
                results = await train_on_rows(self.group, batch, self.cfg.batch.global_batch_size)
                compute += max(r.pop("compute_seconds") for r in results)
            metrics["time/train_step"] = metrics.get("time/train_step", 0.0) + time.perf_counter() - t0
            # Ranks run in parallel: the slowest one's forward/backward/optimizer time is the compute.
            metrics["compute/train_seconds"] = compute
            metrics.update(mean_over_ranks(results, prefix="train"))
        else:
            metrics["train/critic_only_step"] = 1.0
        if ref_update_due(self.cfg, rollout_id + 1):  # the reference scores step rollout_id + 1 with these
            await self._save_for_reference(rollout_id)
        if uses_critic(self.cfg):  # the critic trains on these returns and clears the partition
            if not self.cfg.cluster.fully_async:  # (fully async: the Advantages role wrote them)
                await tq.put_columns(rollout_id, keys, {"returns": jagged(returns)})
        else:
            await tq.clear(rollout_id)
        metrics["time/train"] = time.perf_counter() - start
        return metrics

    async def _stream_pass(self, rollout_id: int) -> tuple[list[str], dict[str, Any], dict[str, float],
                                                            list[dict[str, float]]]:
        """Fully async streaming loader: the first training pass over step `rollout_id`.

        Once Rollout has written every row (the micro-batch plan and the loss normalisers need
        all rows' lengths and masks), the ranks plan the pass (`train_begin`) and are fed each
        row as soon as ActorFwd, Reference and Advantages have completed it (`train_rows`); a
        micro-batch runs when all its rows are in, in the plan's order, so the pass computes
        exactly what a whole-step pass does. Returns the assembled batch and each rank's metrics."""
        start, backoff = time.perf_counter(), Backoff()
        while await tq.step_rows(rollout_id) is None:
            await backoff.wait()
        keys, batch, metrics = await self._read_batch(rollout_id, scored=False)
        metrics["time/wait_rows"] = time.perf_counter() - start
        t0 = time.perf_counter()
        fields = self._scored_fields()
        for name in fields:
            batch[name] = [None] * len(keys)
        num_steps, shards_idx, tokens_per_step = step_plan(batch["loss_masks"], self.cfg.batch.global_batch_size,
                                                           self.group.world_size)
        await self.group.call_sharded("train_begin", [[len(batch["tokens"][i]) for i in idx] for idx in shards_idx],
                                      num_steps, tokens_per_step)
        where = {i: (rank, pos) for rank, idx in enumerate(shards_idx) for pos, i in enumerate(idx)}
        index = {key: i for i, key in enumerate(keys)}
        pending: list[tuple[int, Any]] = []  # (rank, ObjectRef of its train_rows call)

        async def feed(ready: list[str], cols: dict[str, Any]) -> None:
            rows = [index[k] for k in ready]
            for name in fields:
                for j, i in enumerate(rows):
                    value = cols[name][j]
                    batch[name][i] = value.tolist() if hasattr(value, "tolist") else value
            per_rank: dict[int, list[tuple[int, int]]] = {}
            for i in rows:
                if i in where:  # rows past the last full optimizer step are not trained
                    per_rank.setdefault(where[i][0], []).append((where[i][1], i))
            for rank, items in per_rank.items():
                columns = {_TRAIN_NAMES.get(name, name): [batch[name][i] for _, i in items]
                           for name in batch if isinstance(batch[name], list)}
                columns.setdefault("old_log_probs", columns["rollout_log_probs"])  # --use-rollout-logprobs
                pending.append((rank, self.group.submit(rank, "train_rows", [pos for pos, _ in items], columns)))

        await tq.stream_step(rollout_id, task="actor", chunk=self.cfg.rollout.n_samples_per_prompt, fields=fields,
                             score=feed, alive=lambda: True)
        ran = await asyncio.gather(*(ref for _, ref in pending))
        results = await self.group.call("train_end")
        # Micro-batches a rank ran before its last rows arrived: training overlapped with scoring.
        last = {rank: i for i, (rank, _) in enumerate(pending)}
        metrics["train/early_micro_batches"] = float(sum(n for i, n in enumerate(ran) if i != last[pending[i][0]]))
        batch["old_log_probs"] = batch.pop("log_probs", None) or batch["rollout_log_probs"]
        metrics["time/train_step"] = time.perf_counter() - t0
        metrics["time/old_log_probs"] = 0.0  # ActorFwd's job in fully-async mode
        return keys, batch, metrics, results

    def _scored_fields(self) -> list[str]:
        """The columns other fully-async roles add to a row before the Actor can train on it."""
        fields = ["advantages"] + (["ref_log_probs"] if needs_reference(self.cfg) else [])
        fields += ["teacher_log_probs"] if needs_teacher(self.cfg) else []  # for opd/* metrics
        return fields + ([] if self.cfg.algo.use_rollout_logprobs else ["log_probs"])

    async def _save_for_reference(self, rollout_id: int) -> None:
        path = Path(reference_sync_dir(self.cfg))
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        await self.group.call("save", str(path), rollout_id, False)
        (path / "for_step.txt").write_text(str(rollout_id + 1))

    async def _wait_rows(self, rollout_id: int) -> None:
        """Fully async, no training this step: until every row of the step is complete."""
        async def skip(keys: list[str], cols: dict[str, Any]) -> None:
            pass

        await tq.stream_step(rollout_id, task="actor", chunk=self.cfg.rollout.n_samples_per_prompt,
                             fields=self._scored_fields(), score=skip, alive=lambda: True)

    def _save_batch(self, rollout_id: int, batch: dict[str, Any]) -> None:
        """`--save-debug-train-data` / `--dump-details`: the exact batch the optimizer steps see."""
        d = self.cfg.debug
        paths = [d.save_debug_train_data.format(rollout_id=rollout_id)] if d.save_debug_train_data else []
        if d.dump_details:
            paths.append(os.path.join(d.dump_details, "train", f"{rollout_id}.pt"))
        for path in paths:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            torch.save({"rollout_id": rollout_id, **batch}, path)

    async def _old_log_probs(self, batch: dict[str, Any]) -> list[list[float]]:
        """The behaviour policy's log-probs: recomputed on the current weights (default) or the
        engine's (`--use-rollout-logprobs`)."""
        if self.cfg.algo.use_rollout_logprobs:
            return batch["rollout_log_probs"]
        _, shards_idx, _ = step_plan(batch["loss_masks"], self.cfg.batch.global_batch_size, self.group.world_size)
        shards = [{"tokens": [batch["tokens"][i] for i in idx],
                   "response_lengths": [batch["response_lengths"][i] for i in idx]} for idx in shards_idx]
        results = await self.group.call_sharded("compute_log_probs", shards)
        old: list[list[float]] = [[] for _ in batch["tokens"]]
        for idx, logps in zip(shards_idx, results):
            for i, lp in zip(idx, logps):
                old[i] = lp
        return old

    async def _read_batch(self, rollout_id: int, *, scored: bool = True) -> tuple[list[str], dict[str, Any],
                                                                                dict[str, float]]:
        """The step's rows in key order, after the staleness check. `scored=False`: Rollout's
        columns only (the streaming loader reads the others as they are written)."""
        keys = await tq.list_keys(rollout_id)
        extra = {"ref_log_probs": needs_reference(self.cfg), "values": uses_critic(self.cfg),
                 "teacher_log_probs": needs_teacher(self.cfg)}
        if not scored:
            extra = {}
        elif self.cfg.cluster.fully_async:  # written by the Advantages and ActorFwd roles
            extra |= {"advantages": True, "log_probs": not self.cfg.algo.use_rollout_logprobs}
        fields = list(tq.ROLLOUT_COLUMNS) + [name for name, wanted in extra.items() if wanted]
        cols = await tq.get_columns(rollout_id, keys, fields)
        lags = [self.version - v for v in cols["weight_versions"].tolist()]
        stale = [i for i, lag in enumerate(lags) if lag > self.cfg.cluster.max_staleness]
        metrics = {"train/max_version_lag": float(max(lags)), "train/rejected_stale_rows": float(len(stale))}
        if stale:  # the rollout gate makes this impossible; if it ever happens, say so loudly
            raise RuntimeError(f"rollout {rollout_id}: {len(stale)} rows lag more than --max-staleness "
                               f"{self.cfg.cluster.max_staleness} weight versions behind the actor's {self.version} "
                               f"(max lag {max(lags)}); the engines missed a weight update")
        batch: dict[str, Any] = {
            "tokens": [t.tolist() for t in cols["tokens"]],
            "response_lengths": cols["response_lengths"].tolist(),
            "loss_masks": [m.tolist() for m in cols["loss_masks"]],
            "rollout_log_probs": [lp.tolist() for lp in cols["rollout_log_probs"]],
            "rewards": cols["rewards"].tolist(),
        }
        for name in ("ref_log_probs", "values", "teacher_log_probs", "log_probs", "advantages"):
            if name in cols:
                batch[name] = [v.tolist() for v in cols[name]]
        if scored and self.cfg.cluster.fully_async and self.cfg.algo.use_rollout_logprobs:
            batch["log_probs"] = batch["rollout_log_probs"]
        return keys, batch, metrics

    async def save(self, rollout_id: int) -> str | None:
        if self.group is None:
            return None
        cfg = self.cfg.ckpt
        return await save_checkpoint(self.group, cfg.save, rollout_id, save_optim=not cfg.no_save_optim,
                                     keep=cfg.max_actor_ckpt_to_keep)

    async def export_hf(self, rollout_id: int) -> str | None:
        if self.group is None:
            return None
        out = self.cfg.ckpt.save_hf.format(rollout_id=rollout_id)
        os.makedirs(out, exist_ok=True)
        await self.group.call("export_hf", out, self.cfg.ckpt.hf_checkpoint)
        return out

    async def shutdown(self) -> None:
        if self.group is not None:
            await self.group.call("shutdown")
            self.group.kill()
            self.group = None


def mean_over_ranks(results: list[dict[str, float]], *, prefix: str) -> dict[str, float]:
    """Per-rank metrics -> one value each: max/min keys by max/min, the rest by mean."""
    out: dict[str, float] = {}
    for key in results[0]:
        values = [r[key] for r in results]
        if key.endswith("_max"):
            out[f"{prefix}/{key}"] = max(values)
        elif key.endswith("_min"):
            out[f"{prefix}/{key}"] = min(values)
        else:
            out[f"{prefix}/{key}"] = sum(values) / len(values)
    return out


async def save_checkpoint(group: RayActorGroup, save_dir: str, rollout_id: int, *, save_optim: bool,
                          keep: int | None) -> str:
    """`save_dir/iter_<rollout_id>` (DCP) plus the latest-iteration marker; prunes to `keep`."""
    path = Path(save_dir) / f"iter_{rollout_id:07d}"
    path.mkdir(parents=True, exist_ok=True)
    await group.call("save", str(path), rollout_id, save_optim)
    (Path(save_dir) / "latest_checkpointed_iteration.txt").write_text(str(rollout_id))
    prune_checkpoints(Path(save_dir), keep)
    return str(path)


def latest_checkpoint(load_dir: str) -> Path | None:
    marker = Path(load_dir) / "latest_checkpointed_iteration.txt"
    if not marker.is_file():
        logger.info("--load %s holds no checkpoint yet; starting from the initial weights", load_dir)
        return None
    return Path(load_dir) / f"iter_{int(marker.read_text().strip()):07d}"


def prune_checkpoints(save_dir: Path, keep: int | None) -> None:
    if not keep:
        return
    for old in sorted(save_dir.glob("iter_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
