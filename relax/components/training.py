"""Training-backend rank groups and what the roles do with them: the shard plan of a step,
training and scoring calls over the ranks, checkpoints on disk.

Shared by the Actor, the Critic, ActorFwd / Reference and the OPD Teacher. A group is
`--resource <role>`'s `Trainer` ranks (`relax.backends.trainer.group.TrainerGroup`) of the
training backend, built from a `TrainerSpec` that says what the model is (`head`, `trainable`),
placed as the run plan says (on a GPU cluster, each rank on its share of a GPU of the run's
placement group, `relax.config.placement`; a process per rank on CPU).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from typing import Any, Literal

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import ModelParallelSpec, TrainerSpec
from relax.backends.trainer.group import ScoreShard, TrainerGroup
from relax.config import roles
from relax.config.checks.megatron import qkv_layout
from relax.config.checks.profiling import train_trace_dir
from relax.config.lora import lora_spec
from relax.config.plan import RolePlan, reuses_training_log_probs
from relax.config.schema import OptimizerConfig, RelaxConfig
from relax.config.train_memory import kept_versions
from relax.distributed import transfer_queue as tq
from relax.distributed.ray.nodes import same_node_options
from relax.types import MEDIA_COLUMN, ROUTING_COLUMN, TrainBatch
from relax.utils import checkpoints
from relax.utils.proc import cpu_compute_env
from relax.utils.seqlen_balance import balanced_partitions

logger = logging.getLogger(__name__)

# --advantage-estimator -> the policy loss it trains with (the others train with PPO-clip).
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


TRAINING_ROLES = roles.TRAINING_ROLES  # roles that may run training-backend ranks


def cpu_threads(cfg: RelaxConfig, ranks: int) -> int:
    """Torch threads of each CPU training rank. Colocate: the phases take turns on the machine
    (engines generate, then the ranks score and train), so the training-backend ranks share
    every core.
    Fully async: every role runs at once, each process on --engine-threads. --true-on-policy-mode:
    --engine-threads too, the engines' count (a reduction split by thread changes the bits)."""
    if cfg.cluster.fully_async or cfg.cluster.true_on_policy_mode:
        return cfg.cluster.engine_threads
    # Scoring roles (reference, critic, a training-backend teacher) may run beside the actor's
    # ranks within a phase: the cores are split over all of them, never oversubscribed (OpenMP
    # threads that outnumber the cores spin and slow every process down).
    resource = cfg.cluster.resource or {}
    total = sum(int((resource.get(name) or [1, 0])[1] or 0) for name in TRAINING_ROLES) or ranks
    return max(1, (os.cpu_count() or 1) // max(1, total, ranks))


def recompute_layers(cfg: RelaxConfig) -> int | None:
    """--recompute-*: None (no recomputation), -1 (every layer) or the first k layers (block)."""
    p = cfg.parallel
    if p.recompute_granularity != "full":
        return None
    return p.recompute_num_layers if p.recompute_method == "block" and p.recompute_num_layers is not None else -1


def push_dtype(cfg: RelaxConfig) -> str | None:
    """bf16 training pushes bf16 weights (see TrainerSpec.push_dtype); true-on-policy mode keeps
    float32, since its engines reproduce the trainer's float32 numerics."""
    return "bfloat16" if cfg.optim.bf16 and not cfg.cluster.true_on_policy_mode else None


def model_parallel_spec(cfg: RelaxConfig) -> ModelParallelSpec:
    """The megatron backend's layout and model flags (fsdp ignores them; validation keeps them unset)."""
    import dataclasses

    p, m = cfg.parallel, cfg.megatron
    return ModelParallelSpec(
        tp=p.tensor_model_parallel_size, pp=p.pipeline_model_parallel_size, cp=p.context_parallel_size,
        ep=p.expert_model_parallel_size, sequence_parallel=p.sequence_parallel,
        recompute_granularity=p.recompute_granularity, recompute_method=p.recompute_method,
        recompute_num_layers=p.recompute_num_layers, distributed_optimizer=cfg.optim.use_distributed_optimizer,
        etp=p.expert_tensor_parallel_size, qkv_format=qkv_layout(cfg)[0], allgather_cp=m.allgather_cp,
        recompute_loss_function=m.recompute_loss_function, model_name=cfg.misc.model_name,
        model_provider=m.custom_model_provider_path,
        arch_flags={f.name: getattr(m, f.name) for f in dataclasses.fields(m)})


def adapter_dir(cfg: RelaxConfig) -> str | None:
    """Where a LoRA push writes adapter files, for engines that load them from disk (SGLang); None:
    adapter tensors travel by broadcast (the hf engine)."""
    from relax.backends.registry import ADAPTER_FILE_ENGINES

    if cfg.cluster.rollout_backend not in ADAPTER_FILE_ENGINES:
        return None
    return os.path.join(os.path.abspath(cfg.misc.exp_dir or "."), "lora_adapters")


def initial_model(cfg: RelaxConfig) -> str:
    """The model the Actor (and ActorFwd, the Reference) are built from: --ref-load when it is an HF
    directory, else --hf-checkpoint (with --ref-ckpt-step, --ref-load is a checkpoint directory: the
    Reference loads that step's weights over this model, `reference_step`; the Actor starts from it)."""
    c = cfg.ckpt
    return c.ref_load if c.ref_load and c.ref_ckpt_step is None else c.hf_checkpoint


def reference_step(cfg: RelaxConfig) -> Path | None:
    """--ref-ckpt-step: the checkpoint step under --ref-load whose weights the Reference loads (None: unset)."""
    c = cfg.ckpt
    if c.ref_ckpt_step is None:
        return None
    return checkpoints.step_checkpoint(c.ref_load, c.ref_ckpt_step, flag="--ref-load", step_flag="--ref-ckpt-step")


def weights_and_memory(cfg: RelaxConfig, role: RolePlan, policy: bool) -> dict[str, Any]:
    """`role`'s TrainerSpec fields of the weight-copy and memory flags (`relax.config.train_memory`) and
    --check-weight-update-equal (the policy pushes, so it checks)."""
    m = cfg.train_memory
    shared_gpu = bool(role.slots) and role.gpu_fraction < 1  # other processes (colocate: the engines) on its GPU
    return {"keep_weights": kept_versions(cfg, role.name), "keep_host_buffers": not m.disable_weights_backuper,
            "memory_margin_bytes": m.train_memory_margin_bytes if shared_gpu else 0,
            "check_weights": policy and cfg.debug.check_weight_update_equal}


def make_trainer_group(cfg: RelaxConfig, role: RolePlan, model_path: str, *, head: Literal["lm", "value"] = "lm",
                       trainable: bool = True, total_steps: int = 1, threads: int | None = None,
                       optim: OptimizerConfig | None = None, adapters: bool = False) -> TrainerGroup:
    """`role.workers` ranks of the training backend: a policy (an "lm" head that trains), a critic
    (a "value" head), or a frozen scorer (the Reference, ActorFwd, a training-backend OPD teacher).
    `adapters`: the model carries the run's LoRA adapters, if --lora-rank sets any (the policy, and
    ActorFwd, which takes its pushed adapters)."""
    policy = head == "lm" and trainable
    lora = lora_spec(cfg) if adapters else None
    spec = TrainerSpec(
        model_path=model_path, backend=cfg.cluster.train_backend, head=head, trainable=trainable, name=role.name,
        optim=optim or cfg.optim, batch=cfg.batch, value_clip=cfg.algo.value_clip,
        loss=policy_loss_config(cfg) if policy else None, temperature=cfg.rollout.rollout_temperature,
        total_steps=total_steps, threads=threads or cpu_threads(cfg, role.workers),
        timeout_minutes=cfg.cluster.distributed_timeout_minutes, dist_backend=cfg.cluster.distributed_backend,
        bucket_bytes=cfg.rollout.update_weight_buffer_size,
        sync_timeout_s=cfg.rollout.weight_sync_timeout, weight_sync_backend=cfg.ckpt.checkpoint_engine_backend,
        push_dtype=push_dtype(cfg), custom_loss_path=cfg.algo.custom_loss_function_path,
        pg_loss_reducer_path=cfg.algo.custom_pg_loss_reducer_function_path, tis_path=cfg.algo.custom_tis_function_path,
        true_on_policy=cfg.cluster.true_on_policy_mode, recompute_layers=recompute_layers(cfg),
        old_logp_from_training=policy and reuses_training_log_probs(cfg),
        compile_layers=cfg.parallel.use_torch_compile, model_parallel=model_parallel_spec(cfg),
        lora=lora, adapter_dir=adapter_dir(cfg) if lora else None,
        routing_replay=cfg.algo.use_routing_replay and head == "lm",  # MoE routing replay (docs/moe.md)
        profile=cfg.train_profile, trace_dir=train_trace_dir(cfg),  # profiling and memory tools (observability.md)
        **weights_and_memory(cfg, role, policy),
    )
    placed = None
    if role.slots:  # a GPU cluster: each rank on its bundle of the run's placement group
        from relax.distributed.ray.placement import on_bundle, run_gpu_group

        pg = run_gpu_group()
        placed = [on_bundle(pg, slot[0], role.gpu_fraction) for slot in role.slots]
    elif (pinned := same_node_options()) is not None:  # a CPU run over several nodes: the role's node
        placed = [pinned] * role.workers
    env = {} if role.slots else cpu_compute_env()  # (CPU ranks: OpenMP threads that wait sleep)
    env.update({k: str(v) for k, v in cfg.misc.train_env_vars.items()})
    return TrainerGroup(spec, role.workers, name=role.name, rank_options=placed, env_vars=env)


def optimizer_steps_total(cfg: RelaxConfig) -> int:
    """Optimizer steps of the whole run (the length of the LR schedule)."""
    per_rollout = cfg.rollout.rollout_batch_size * cfg.rollout.n_samples_per_prompt // cfg.batch.global_batch_size
    return per_rollout * cfg.cluster.num_iters_per_train_update * (cfg.rollout.num_rollout or 1)


def trains_actor(cfg: RelaxConfig, rollout_id: int) -> bool:
    """False while only the critic trains (--num-critic-only-steps, --critic-train-only)."""
    return not (cfg.algo.critic_train_only or rollout_id < cfg.algo.num_critic_only_steps)


# ---- a step's rows over the ranks ------------------------------------------------------------

def shard_rows(num_rows: int, num_steps: int, world_size: int) -> list[list[int]]:
    """Row indices per rank: each optimizer step's rows split evenly, step order kept."""
    per_step = num_rows // num_steps
    per_rank = per_step // world_size
    return [[s * per_step + r * per_rank + i for s in range(num_steps) for i in range(per_rank)]
            for r in range(world_size)]


def balanced_shard_rows(seq_lens: list[int], num_steps: int, world_size: int) -> list[list[int]]:
    """`shard_rows`' rows (the same ones in each optimizer step), but within each step split so
    that every rank's token count is about equal (`--balance-data`; Karmarkar-Karp, equal row
    counts). Groups stay in their step; only which rank trains a row changes."""
    per_step = len(seq_lens) // num_steps
    used = per_step // world_size * world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for s in range(num_steps):
        rows = list(range(s * per_step, s * per_step + used))
        for rank, part in enumerate(balanced_partitions([seq_lens[i] for i in rows], world_size)):
            shards[rank] += [rows[i] for i in part]
    return shards


def step_plan(loss_masks_RT: list[list[int]], global_batch_size: int, world_size: int,
              seq_lens: list[int] | None = None) -> tuple[int, list[list[int]], list[int]]:
    """How a step's rows train: (optimizer steps, row indices per rank, loss tokens per step).
    `seq_lens` (`--balance-data`): each row's token count, to balance the ranks' tokens by."""
    n_rows = len(loss_masks_RT)
    num_steps = max(1, n_rows // global_batch_size)
    per_step = n_rows // num_steps
    tokens_per_step = [int(sum(sum(loss_masks_RT[i]) for i in range(s * per_step, (s + 1) * per_step)))
                       for s in range(num_steps)]
    shards = (shard_rows(n_rows, num_steps, world_size) if seq_lens is None else
              balanced_shard_rows(seq_lens, num_steps, world_size))
    return num_steps, shards, tokens_per_step


def balance_lengths(cfg: RelaxConfig, batch: TrainBatch) -> list[int] | None:
    """`--balance-data`: the rows' token counts, which `step_plan` balances the ranks by (None: off)."""
    return [len(t) for t in batch.tokens_RL] if cfg.batch.balance_data else None


async def train_on_rows(group: TrainerGroup, batch: TrainBatch, global_batch_size: int,
                        seq_lens: list[int] | None = None) -> list[dict[str, float]]:
    """`len(batch) / global_batch_size` optimizer steps of `group` over `batch`, sharded over its
    ranks (balanced by `seq_lens` when given); returns each shard's metrics."""
    num_steps, shards_idx, tokens_per_step = step_plan(batch.loss_masks_RT, global_batch_size, group.dp_size,
                                                       seq_lens)
    return await group.train([batch.rows(idx) for idx in shards_idx], num_steps, tokens_per_step)


def score_shards(num_rows: int, world_size: int) -> list[list[int]]:
    """Rows per rank for a forward-only pass: even shares, the remainder on the last rank."""
    shards = shard_rows(num_rows - num_rows % world_size, 1, world_size)
    shards[-1].extend(range(sum(map(len, shards)), num_rows))
    return shards


async def score_rows(group: TrainerGroup, tokens_RL: list[list[int]], lengths_R: list[int],
                     media_R: list[bytes] | None = None, routing_R: list[bytes] | None = None,
                     weights_version: int | None = None) -> tuple[list[list[float]], float]:
    """Every rank's forward-only pass on its share of the rows (`media_R`: a multimodal run's
    encoder tensors per row; `routing_R`: R3's routing records; `weights_version`, --keep-old-actor:
    on the ranks' kept copy of that version): log-probs, or a value head's values. Returns per-row
    response-aligned results in row order and the slowest rank's compute seconds."""
    shards_idx = score_shards(len(tokens_RL), group.dp_size)
    pick = lambda column, idx: None if column is None else [column[i] for i in idx]  # noqa: E731
    results = await group.score([ScoreShard([tokens_RL[i] for i in idx], [lengths_R[i] for i in idx],
                                            pick(media_R, idx), pick(routing_R, idx)) for idx in shards_idx],
                                weights_version)
    compute = await group.pop_compute_seconds()
    out: list[list[float]] = [[] for _ in tokens_RL]
    for idx, res in zip(shards_idx, results):
        for i, values in zip(idx, res):
            out[i] = values
    return out, compute


async def read_rows(rollout_id: int, media: bool = False
                    ) -> tuple[list[str], list[list[int]], list[int], list[bytes] | None]:
    """Keys, token lists, response lengths and (`media`: a multimodal run) encoder tensors of every
    row of step `rollout_id`, in key order."""
    keys = await tq.list_keys(rollout_id)
    fields = ["tokens", "response_lengths"] + ([MEDIA_COLUMN] if media else [])
    cols = await tq.get_columns(rollout_id, keys, fields)
    return (keys, [t.tolist() for t in cols["tokens"]], cols["response_lengths"].tolist(),
            tq.media_bytes(cols.get(MEDIA_COLUMN)))


async def read_routing(rollout_id: int, keys: list[str]) -> list[bytes]:
    """R3: the rows' routing records (the Rollout's `rollout_routed_experts` bytes), in `keys` order."""
    cols = await tq.get_columns(rollout_id, keys, [ROUTING_COLUMN])
    return tq.media_bytes(cols[ROUTING_COLUMN])


def mean_over_ranks(results: list[dict[str, float]], *, prefix: str) -> dict[str, float]:
    """Per-rank metrics -> one value each: max/min keys by max/min, the rest by mean. Keys that
    name their own group ("memory/train_peak_gib") take the largest rank's value, under the
    actor's own name and the `prefix` of the others."""
    out: dict[str, float] = {}
    for key in results[0]:
        values = [r[key] for r in results]
        if "/" in key:
            out[key if prefix == "train" else f"{prefix}/{key}"] = max(values)
        elif key.endswith("_max"):
            out[f"{prefix}/{key}"] = max(values)
        elif key.endswith("_min"):
            out[f"{prefix}/{key}"] = min(values)
        else:
            out[f"{prefix}/{key}"] = sum(values) / len(values)
    return out


# ---- checkpoints -----------------------------------------------------

class CheckpointPart:
    """A training role's part of each checkpoint: its ranks write `save_dir/iter_<rollout_id>` (model
    and optimizer shards, RNG, meta) under a temporary name, then it moves into place. Committed
    (manifest, pointer) by the Controller once every role's part is there.

    `background` (--async-save): `save` returns once the ranks have copied their state to the host;
    they write it while training goes on, and `finish` waits for the write (raising its failure)
    and moves the part into place. The next `save` finishes the previous one first."""

    def __init__(self, group: TrainerGroup, background: bool) -> None:
        self.group, self.background = group, background
        self.pending: tuple[Path, Path] | None = None  # (partial, final) of a write in flight

    async def save(self, save_dir: str, rollout_id: int, *, save_optim: bool) -> str:
        """Write (or with `background`, start writing) step `rollout_id`'s part; returns where it goes."""
        await self.finish()
        final = checkpoints.iter_dir(save_dir, rollout_id)
        partial = checkpoints.stage(final)
        await self.group.save(str(partial), rollout_id, save_optim, background=self.background)
        self.pending = (partial, final)
        if not self.background:
            await self.finish()
        return str(final)

    async def finish(self) -> None:
        """Wait for the part being written, if any, and move it into place."""
        if self.pending is None:
            return
        (partial, final), self.pending = self.pending, None
        if self.background:
            await self.group.wait_saved()
        checkpoints.publish(partial, final)


def trainer_checkpoint(load_dir: str) -> Path | None:
    """The latest complete training checkpoint under `load_dir` by its own pointer (a directory
    given on its own, e.g. --critic-load); None when it holds none."""
    pointer = Path(load_dir) / checkpoints.POINTER
    if not pointer.is_file():
        logger.info("%s holds no checkpoint yet; starting from the initial weights", load_dir)
        return None
    path = checkpoints.iter_dir(load_dir, int(pointer.read_text().strip()))
    missing = checkpoints.trainer_part_missing(path)
    if missing:
        raise checkpoints.CheckpointError(f"{path} is incomplete, missing: {', '.join(missing)}")
    return path
