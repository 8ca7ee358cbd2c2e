"""The backend-agnostic half of a training rank (fsdp, megatron): micro-batch plans, the
training pass (whole-shard and streamed), the policy and value losses, the optimizer step, the
scoring passes, offload, and the weight push to the engines. A backend subclass builds and runs
the model (`relax.backends.fsdp.worker`, `relax.backends.megatron.worker`).

Data parallelism is the backend's business: rows arrive per data-parallel shard (a
model-parallel group of ranks receives the same rows, `parallel_info`), each rank normalises its
loss by the step's loss tokens over the data-parallel size, and the backend reduces gradients
(`_reduce_grads`, FSDP does it inside backward) before the optimizer step. The loss itself is
`relax.algorithms.policy_loss` / `value_loss`, never re-implemented in a backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import random
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from relax.algorithms.policy_loss import PolicyLossInputs, PolicyLossOutput, compute_policy_loss
from relax.algorithms.value_loss import ValueLossInputs, compute_value_loss
from relax.backends.base import TrainerSpec
from relax.backends.batching import even_out, pad_response, split_micro_batches
from relax.config.schema import OptimizerConfig
from relax.distributed.store import pin_gloo_interface, tcp_store
from relax.distributed.weight_sync import parse_dtype
from relax.types import TrainBatch
from relax.utils.plugins import load_plugin

logger = logging.getLogger(__name__)

TRAINABLE_ROLES = ("actor", "critic")


def lr_lambda(optim: OptimizerConfig, total_steps: int):
    """Warm-up then constant / linear / cosine decay to min_lr, as a LambdaLR factor."""
    decay_steps = max(1, (optim.lr_decay_iters or total_steps) - optim.lr_warmup_iters)
    floor = optim.min_lr / optim.lr if optim.lr else 0.0

    def factor(step: int) -> float:
        if step < optim.lr_warmup_iters:
            return (step + 1) / optim.lr_warmup_iters
        progress = min(1.0, (step - optim.lr_warmup_iters) / decay_steps)
        if optim.lr_decay_style == "linear":
            return floor + (1 - floor) * (1 - progress)
        if optim.lr_decay_style == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return factor


def load_loss_plugins(spec: TrainerSpec) -> tuple[Any, Any]:
    """The loss function (built-in or `--custom-loss-function-path`) and an optional pg-loss
    reducer factory; `--custom-tis-function-path` is bound into the loss config."""
    loss_fn, reducer_factory = compute_policy_loss, None
    if spec.custom_loss_path:
        loss_fn = load_plugin(spec.custom_loss_path, flag="--custom-loss-function-path", positional=2,
                              expected="custom_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig)")
    if spec.pg_loss_reducer_path:
        reducer_factory = load_plugin(spec.pg_loss_reducer_path, flag="--custom-pg-loss-reducer-function-path",
                                      positional=1, keywords=("per_token_loss", "num_global_samples",
                                                              "num_global_tokens"),
                                      expected="reducer_factory(mask_BT, *, per_token_loss, num_global_samples, "
                                               "num_global_tokens) -> fn(values_BT) -> scalar")
    if spec.tis_path and spec.loss is not None:
        spec.loss.tis_fn = load_plugin(spec.tis_path, flag="--custom-tis-function-path", positional=2,
                                       keywords=("clip", "clip_low"),
                                       expected="tis(logp_old, logp_rollout, *, clip, clip_low) -> weights")
    return loss_fn, reducer_factory


def reduce_metric(op: str, current: float | None, value: float) -> float:
    """Combine one metric across micro-batches/steps: sum (pre-normalised means), max or min."""
    if current is None:
        return value
    return {"max": max, "min": min}.get(op, lambda a, b: a + b)(current, value)


GIB = float(1 << 30)


def gpu_used_bytes(device: torch.device) -> int:
    """Memory in use on the whole GPU (every process on it, CUDA contexts included)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def sync_metrics(stats: Any) -> dict[str, float]:
    return {"weight_sync/bytes": float(stats.bytes), "weight_sync/seconds": float(stats.seconds),
            "weight_sync/gbps": float(stats.gbps), "weight_sync/buckets": float(stats.num_buckets),
            "weight_sync/version": float(stats.version)}


@dataclasses.dataclass
class _TrainPass:
    """One pass over a shard (see `FSDPTrainWorker.train_begin`): the micro-batch plan per
    optimizer step (row positions), the rows arrived so far and where the pass stands."""

    plan: list[list[list[int]]]
    global_tokens: list[int]
    num_rows: int
    batch: TrainBatch | None = None
    arrived: set[int] = dataclasses.field(default_factory=set)
    step: int = 0
    micro: int = 0
    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    totals: dict[str, float] = dataclasses.field(default_factory=dict)


class TrainWorkerBase:
    """One rank of a training backend: everything that does not depend on how the model is built
    or run. A backend subclass provides `_build_model`, `_forward`, `_values`, `_full_state`,
    `_weight_receiver` (what loads pushed weights; `receive_weights` is the shared protocol) and
    the checkpoint methods, and may override the hooks `_setup_parallel`
    (process groups beyond the world's), `_set_grad_sync`, `_reduce_grads`, `_clip_grad_norm`,
    `data_parallel_rank` and `parallel_info`."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, spec: TrainerSpec) -> None:
        self.rank, self.world_size, self.spec = rank, world_size, spec
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // world_size))
        timeout = timedelta(minutes=spec.timeout_minutes)
        pin_gloo_interface(master_addr)  # gloo and the store listen on the group's address only
        store = tcp_store(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
        dist.init_process_group(spec.dist_backend if self.device.type == "cuda" else "gloo", store=store,
                                rank=rank, world_size=world_size, timeout=timeout)
        self.dp_rank, self.dp_size = rank, world_size  # _setup_parallel narrows them under model parallelism
        self._setup_parallel()
        self._seed(spec.optim.seed + rank)
        self.model = self._build_model(spec.model_path)
        self.optimizer = self.scheduler = None
        if spec.role in TRAINABLE_ROLES:
            self._build_optimizer()
        self.loss_fn, self.reducer_factory = load_loss_plugins(spec)
        self._sender = None
        self._pending_push = None  # a background weight push in flight (fully async)
        self._receiver = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.step = 0
        self.compute_seconds = 0.0
        self._pass: _TrainPass | None = None

    # ---- setup -------------------------------------------------------------------------
    def _setup_parallel(self) -> None:
        """Process groups beyond the world's (model parallelism); sets `dp_rank` / `dp_size`."""

    def parallel_info(self) -> dict[str, Any]:
        """Where this rank's rows come from and whether its results are returned: every rank of
        one data-parallel shard receives the same rows; `output` ranks (one per shard) answer."""
        return {"dp_rank": self.dp_rank, "dp_size": self.dp_size, "output": True}

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)

    def _apply_freezing(self, model: torch.nn.Module) -> None:
        import re

        only, frozen = self.spec.optim.only_train_params_name_list, self.spec.optim.freeze_params_name_list
        if self.spec.role != "actor" or not (only or frozen):
            return
        for name, p in model.named_parameters():
            if only:
                p.requires_grad_(any(re.search(pat, name) for pat in only))
            elif frozen and any(re.search(pat, name) for pat in frozen):
                p.requires_grad_(False)

    def _build_optimizer(self) -> None:
        o = self.spec.optim
        params = self._optimized_parameters()
        # On GPUs the fused kernel: one launch per parameter group instead of several per tensor.
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                                           weight_decay=o.weight_decay, fused=self.device.type == "cuda")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o, self.spec.total_steps))

    def _optimized_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps (a backend with float32 main weights returns those)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    # ---- forward passes ----------------------------------------------------------------
    def _micro_batches(self, lengths: list[int], max_tokens: int | None) -> list[list[int]]:
        """This rank's micro-batches (row indices). Where a forward is a collective across ranks
        that hold different rows (`_lockstep_group`), every rank of the group runs as many as the
        busiest: larger ones are split, and an empty one stands for a throwaway forward
        (`_rows_of`). Without it a rank with fewer micro-batches (dynamic batching, or a scoring
        shard with one row less) left its peers blocked in an all-gather, or paired their
        collectives with its next pass's."""
        b = self.spec.batch
        micro = split_micro_batches(lengths, micro_batch_size=b.micro_batch_size,
                                    max_tokens=max_tokens if b.use_dynamic_batch_size else None)
        group = self._lockstep_group()
        if group is None:
            return micro
        count = torch.tensor([len(micro)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
        return even_out(micro, lengths, int(count.item()))

    def _lockstep_group(self) -> Any:
        """The process group whose ranks must run the same number of micro-batches (their
        forwards communicate), or None (the default: forwards are local)."""
        return None

    @staticmethod
    def _rows_of(idx: list[int], tokens: list[list[int]], lengths: list[int]) -> tuple[list[list[int]], list[int]]:
        """A micro-batch's tokens and response lengths; an empty one (`even_out`) is a throwaway
        row of two pad tokens whose output is dropped."""
        if not idx:
            return [[0, 0]], [1]
        return [tokens[i] for i in idx], [lengths[i] for i in idx]

    @torch.no_grad()
    def compute_log_probs(self, tokens: list[list[int]], lengths: list[int],
                          media: list[bytes] | None = None) -> list[list[float]]:
        """Per-row response log-probs under the current weights (old policy or reference);
        `media`: a multimodal run's encoder tensors per row (TransferQueue's bytes)."""
        self.model.eval()
        start = time.perf_counter()
        budget = self.spec.batch.log_probs_max_tokens_per_gpu or self.spec.batch.max_tokens_per_gpu
        out: list[list[float]] = [[] for _ in tokens]
        for idx in self._micro_batches([len(t) for t in tokens], budget):
            logp_BT, _, _ = self._forward(*self._rows_of(idx, tokens, lengths),
                                          media=None if media is None or not idx else [media[i] for i in idx])
            for row, i in enumerate(idx):
                out[i] = logp_BT[row, : lengths[i]].cpu().tolist()
        if self.spec.true_on_policy:
            self._balance_row_forwards(len(tokens))
        self.compute_seconds += time.perf_counter() - start
        return out

    @torch.no_grad()
    def compute_values(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]:
        """Critic: per-row response values under the current weights."""
        self.model.eval()
        start = time.perf_counter()
        budget = self.spec.batch.log_probs_max_tokens_per_gpu or self.spec.batch.max_tokens_per_gpu
        out: list[list[float]] = [[] for _ in tokens]
        for idx in self._micro_batches([len(t) for t in tokens], budget):
            values_BT, _ = self._values(*self._rows_of(idx, tokens, lengths))
            for row, i in enumerate(idx):
                out[i] = values_BT[row, : lengths[i]].cpu().tolist()
        self.compute_seconds += time.perf_counter() - start
        return out

    def pop_compute_seconds(self) -> float:
        """Seconds spent in forward/backward/optimizer since the last call (for overhead accounting)."""
        value, self.compute_seconds = self.compute_seconds, 0.0
        return value

    # ---- training ----------------------------------------------------------------------
    def train(self, batch: TrainBatch, num_steps: int, global_tokens_per_step: list[int]) -> dict[str, float]:
        """`num_steps` optimizer steps over this rank's shard (split evenly, in order).

        The actor's batch has advantages and old log-probs (and ref/rollout log-probs when the
        loss uses them); a critic's has values (the old values) and returns.
        The whole shard at once: `train_begin`, `train_rows` with every row, `train_end`.
        """
        self.train_begin([len(t) for t in batch.tokens_RL], num_steps, global_tokens_per_step)
        self.train_rows(list(range(len(batch))), batch)
        return self.train_end()

    def train_begin(self, lengths: list[int], num_steps: int, global_tokens_per_step: list[int]) -> None:
        """Start a pass over a shard of `len(lengths)` rows (token counts `lengths`) whose rows
        arrive later, in any order, through `train_rows` (the fully-async streaming loader).
        The micro-batch plan is fixed now from the lengths, as `train` would make it, so a
        streamed pass computes exactly what a whole-shard pass does."""
        if self.optimizer is None:
            raise RuntimeError(f"{self.spec.role} workers do not train")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)  # train_end reports this pass's peak
        per_step = len(lengths) // num_steps
        plan = []
        for s in range(num_steps):
            rows = list(range(s * per_step, (s + 1) * per_step))
            micro = self._micro_batches([lengths[i] for i in rows], self.spec.batch.max_tokens_per_gpu)
            if not all(micro):
                raise RuntimeError(f"step {s}: this rank has {len(rows)} rows but its peers run {len(micro)} "
                                   "micro-batches; training shards must hold as many rows on every rank "
                                   "(relax.components.training.shard_rows)")
            plan.append([[rows[i] for i in idx] for idx in micro])
        self._pass = _TrainPass(plan=plan, global_tokens=list(global_tokens_per_step), num_rows=len(lengths))
        self.model.train()

    def train_rows(self, positions: list[int], rows: TrainBatch) -> int:
        """Rows `positions` of the shard (`rows`, in that order) have arrived: run every
        micro-batch whose rows are all in, in plan order, stepping the optimizer after each
        step's last one. Returns how many micro-batches ran."""
        p = self._pass
        if p is None:
            raise RuntimeError("train_rows before train_begin")
        if p.batch is None:
            p.batch = TrainBatch.empty(p.num_rows, rows.present())
        p.batch.put(positions, rows)
        p.arrived.update(positions)
        start, ran = time.perf_counter(), 0
        while p.step < len(p.plan) and all(i in p.arrived for i in p.plan[p.step][p.micro]):
            micro = p.plan[p.step]
            if p.micro == 0:
                self.optimizer.zero_grad(set_to_none=True)
            rows = [r for m in micro for r in m]
            self._set_grad_sync(p.micro == len(micro) - 1)
            out = self._micro_loss(p.batch, micro[p.micro], num_samples=len(rows),
                                   num_tokens=p.global_tokens[p.step] / self.dp_size)
            out.loss.backward()
            for k, v in out.metrics.items():
                p.sums[k] = reduce_metric(out.reduce_ops.get(k, "sum"), p.sums.get(k), float(v))
            p.micro, ran = p.micro + 1, ran + 1
            if p.micro == len(micro):
                self._end_step(p)
        self.compute_seconds += time.perf_counter() - start
        return ran

    def _end_step(self, p: _TrainPass) -> None:
        """The step's micro-batches have run: optimizer step, its metrics into the pass's totals."""
        metrics = self._optimizer_step(p.sums)
        for k, v in metrics.items():
            op = "max" if k.endswith("_max") else "min" if k.endswith("_min") else "sum"
            p.totals[k] = reduce_metric(op, p.totals.get(k), v if op != "sum" else v / len(p.plan))
        p.step, p.micro, p.sums = p.step + 1, 0, {}

    def train_end(self) -> dict[str, float]:
        """Finish the pass: every optimizer step must have run. Metrics averaged over steps."""
        p, self._pass = self._pass, None
        if p is None or p.step < len(p.plan):
            missing = 0 if p is None else p.num_rows - len(p.arrived)
            raise RuntimeError(f"{self.spec.role} rank {self.rank}: train_end with {missing} row(s) of the pass "
                               "never sent; every row of the shard must arrive through train_rows")
        p.totals["compute_seconds"] = self.pop_compute_seconds()
        if self.device.type == "cuda":
            p.totals |= {"memory/train_peak_gib": torch.cuda.max_memory_allocated(self.device) / GIB,
                         "memory/train_gpu_used_gib": gpu_used_bytes(self.device) / GIB}
        return p.totals

    def _set_grad_sync(self, last_micro_batch: bool) -> None:
        """Before each micro-batch's backward: whether gradients are reduced in this backward."""

    def _reduce_grads(self) -> None:
        """Before the optimizer step: average gradients over data-parallel ranks (if backward did not)."""

    def _clip_grad_norm(self, clip: float) -> float:
        """Clip to `clip` (0: no clipping) and return the global gradient norm."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        return float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)

    def _optimizer_step(self, sums: dict[str, float]) -> dict[str, float]:
        self._reduce_grads()
        grad_norm = self._clip_grad_norm(self.spec.optim.clip_grad)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("step %d: non-finite grad norm %s; optimizer step skipped", self.step, grad_norm)
        self.scheduler.step()
        self.step += 1
        return {**sums, "grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0]}

    def _micro_loss(self, batch: TrainBatch, rows: list[int], *, num_samples: int, num_tokens: float):
        if self.spec.role == "critic":
            return self._value_micro_loss(batch, rows, num_samples=num_samples, num_tokens=num_tokens)
        lengths = [batch.response_lengths_R[i] for i in rows]
        # Entropy is always reported; it carries a gradient only into a loss that can use it.
        media = batch.multimodal_train_inputs_RB
        logp_BT, mask_BT, ent_BT = self._forward([batch.tokens_RL[i] for i in rows], lengths, entropy=True,
                                                 entropy_grad=self._entropy_grad(),
                                                 media=None if media is None else [media[i] for i in rows])
        return self._policy_loss(batch, rows, logp_BT, mask_BT, ent_BT, num_samples=num_samples,
                                 num_tokens=num_tokens)

    def _entropy_grad(self) -> bool:
        return self.spec.loss.entropy_coef != 0 or bool(self.spec.custom_loss_path)

    def _policy_loss(self, batch: TrainBatch, rows: list[int], logp_BT: torch.Tensor, mask_BT: torch.Tensor,
                     ent_BT: torch.Tensor | None, *, num_samples: int, num_tokens: float):
        """The policy loss of micro-batch `rows` from its forward's response log-probs."""
        cfg = self.spec.loss
        width = logp_BT.shape[1]

        def col(values_RT: list[list[float]] | None) -> torch.Tensor | None:
            return None if values_RT is None else pad_response([values_RT[i] for i in rows], width).to(self.device)

        loss_mask_BT = col(batch.loss_masks_RT) * mask_BT
        old_logp_BT = col(batch.old_log_probs_RT)
        if old_logp_BT is None and self.spec.old_logp_from_training:  # one on-policy pass: the ratio is exactly 1
            old_logp_BT = logp_BT.detach()
        inputs = PolicyLossInputs(
            logp=logp_BT, old_logp=old_logp_BT, advantages=col(batch.advantages_RT),
            mask_BT=loss_mask_BT, ref_logp=col(batch.ref_log_probs_RT), rollout_logp=col(batch.rollout_log_probs_RT),
            entropy=ent_BT, num_global_samples=num_samples, num_global_tokens=num_tokens,
        )
        if self.reducer_factory is not None:
            cfg = dataclasses.replace(cfg, pg_loss_reducer=self.reducer_factory(
                loss_mask_BT, per_token_loss=cfg.per_token_loss, num_global_samples=num_samples,
                num_global_tokens=num_tokens))
        out = self.loss_fn(inputs, cfg)
        if isinstance(out, tuple):  # custom losses may return (loss, metrics)
            out = PolicyLossOutput(loss=out[0], metrics=dict(out[1]))
        return out

    def _value_micro_loss(self, batch: TrainBatch, rows: list[int], *, num_samples: int,
                          num_tokens: float) -> PolicyLossOutput:
        values_BT, mask_BT = self._values([batch.tokens_RL[i] for i in rows],
                                          [batch.response_lengths_R[i] for i in rows])
        width = values_BT.shape[1]

        def col(values_RT: list[list[float]]) -> torch.Tensor:
            return pad_response([values_RT[i] for i in rows], width).to(self.device)

        inputs = ValueLossInputs(values=values_BT, old_values=col(batch.values_RT), returns=col(batch.returns_RT),
                                 mask_BT=col(batch.loss_masks_RT) * mask_BT, num_global_samples=num_samples,
                                 num_global_tokens=num_tokens)
        return compute_value_loss(inputs, value_clip=self.spec.value_clip,
                                  per_token_loss=self.spec.optim.calculate_per_token_loss)

    # ---- offload (colocate on shared GPUs) -----------------------------------------------
    @torch.no_grad()
    def offload(self) -> dict[str, float]:
        """Move parameters, gradients and optimizer state to the host and return the GPU memory
        to the driver, so the engines on this GPU have it while they generate."""
        if self.device.type != "cuda":
            return {}
        start = time.perf_counter()
        self._move_state(torch.device("cpu"))
        torch.cuda.synchronize(self.device)
        # cuBLAS keeps its workspaces in the caching allocator; one left inside a large segment
        # pins the whole segment (seen: 64 MiB of workspace holding 2.1 GiB of a Qwen3-0.6B run).
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        return {"memory/trainer_offloaded_gib": torch.cuda.memory_reserved(self.device) / GIB,
                "memory/rollout_phase_gpu_used_gib": gpu_used_bytes(self.device) / GIB,
                "time/offload_train": time.perf_counter() - start}

    @torch.no_grad()
    def onload(self) -> dict[str, float]:
        """Back to the GPU before scoring and training."""
        if self.device.type != "cuda":
            return {}
        start = time.perf_counter()
        self._move_state(self.device)
        torch.cuda.synchronize(self.device)
        return {"time/onload_train": time.perf_counter() - start}

    def _move_state(self, device: torch.device) -> None:
        self.model.to(device)  # FSDP2 swaps each parameter's data in place: the optimizer's keys stay valid
        for state in (self.optimizer.state.values() if self.optimizer is not None else ()):
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device != device:
                    state[key] = value.to(device)

    # ---- weights out -------------------------------------------------------------------
    def _submit(self, coro):
        """Run `coro` on the weight-sync thread's loop; returns a concurrent future."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True, name="weight-sync").start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run_async(self, coro):
        return self._submit(coro).result()

    def _finish_pending_push(self) -> dict[str, float]:
        """Wait for a background push (raising its error); its metrics, or {} if none was running."""
        pending, self._pending_push = self._pending_push, None
        return sync_metrics(pending.result()) if pending is not None else {}

    def _weight_backend(self) -> str:
        """`--checkpoint-engine-backend` on GPU; gloo for CPU tensors (NCCL cannot carry them)."""
        return self.spec.weight_sync_backend if self.device.type == "cuda" else "gloo"

    def connect_engines(self, engine_urls: list[str], api_key: str | None) -> str | None:
        """Rank 0 joins the engines' weight-update group; returns the backend (nccl / gloo)."""
        if self.rank != 0:
            return None
        from relax.distributed.weight_sync import WeightSender

        backend = self._weight_backend()
        if self._sender is not None:
            self._run_async(self._sender.close())
        self._sender = WeightSender(engine_urls, api_key=api_key, backend=backend,
                                    bucket_bytes=self.spec.bucket_bytes, timeout_s=self.spec.sync_timeout_s,
                                    device=self.device)
        self._run_async(self._sender.connect())
        return backend

    def push_weights(self, version: int, background: bool = False) -> dict[str, float]:
        """Gather full weights (all ranks) and broadcast them to every receiver (rank 0).

        `background` (fully async): the broadcast of a snapshot runs on the weight-sync thread
        while this rank goes on to the next training step; the next push, a topology change or
        shutdown waits for it first (and raises its error). The metrics returned are then those
        of the push that finished meanwhile (the previous one)."""
        dtype = parse_dtype(self.spec.push_dtype) if self.spec.push_dtype else None
        state = list(self._full_state(dtype))
        if self.rank != 0:
            return {}
        finished = self._finish_pending_push()
        if not background:
            return sync_metrics(self._run_async(self._sender.push([(n, t) for n, t, _ in state], version=version)))
        # Training must not change what is sent: parameters' own memory is copied.
        snapshot = [(name, t if fresh else t.clone()) for name, t, fresh in state]
        self._pending_push = self._submit(self._sender.push(snapshot, version=version))
        return finished

    def connect_receivers(self, endpoints: list[Any], api_key: str | None, pause_mode: str = "in_place",
                          devices: list[Any] | None = None) -> str | None:
        """(Re)build the weight group for a new topology: engine URLs and receiver endpoints, with
        the GPUs each holds its weights on (`devices`, identities as `gpu_identity()` gives them).
        Receivers on this rank's GPU take CUDA IPC handles; the others join the broadcast group.
        Returns how weights travel (rank 0; None on the other ranks)."""
        if self.rank != 0:
            return None
        from relax.distributed.weight_sync import WeightSender

        self._finish_pending_push()
        if self._sender is not None:
            self._run_async(self._sender.close())
        mine = self.gpu_identity()
        ipc_ranks = [len(gpus) if mine is not None and mine in (gpus or ()) else 0
                     for gpus in (devices or [()] * len(endpoints))]
        self._sender = WeightSender(endpoints, api_key=api_key, backend=self._weight_backend(),
                                    bucket_bytes=self.spec.bucket_bytes, timeout_s=self.spec.sync_timeout_s,
                                    device=self.device, pause_mode=pause_mode, ipc_ranks=ipc_ranks)
        self._run_async(self._sender.connect())
        ipc = sum(1 for n in ipc_ranks if n)
        return self._sender.backend if not ipc else f"cuda-ipc x{ipc}" + (
            f" + {self._sender.backend}" if ipc < len(ipc_ranks) else "")

    def gpu_identity(self) -> str | None:
        """This rank's GPU as weight receivers are described to the sender (None on CPU)."""
        from relax.distributed.ray.placement import gpu_identity

        return gpu_identity() if self.device.type == "cuda" else None

    # ---- weights in (fully async: ActorFwd takes the actor's weights) ------------------
    def weight_version(self) -> int | None:
        return None if self._receiver is None else self._receiver.version

    def _weight_receiver(self) -> Any:
        """The backend's `WeightReceiver` (with a `version`), loading pushed HF tensors into its model."""
        raise NotImplementedError(f"{type(self).__name__} does not receive weights")

    def receive_weights(self, path: str, payload: dict) -> dict[str, Any]:
        """The receiving side of SGLang's weight-update protocol, reached through a Ray handle.

        Pause/flush/continue are no-ops: this actor runs one call at a time, so no forward pass
        overlaps a load. `received` tells the sender whether the bucket's bytes were consumed."""
        if self._receiver is None:
            self._receiver = self._weight_receiver()
        try:
            if path == "/init_weights_update_group":
                return {"success": True, "message": self._receiver.init_group(**payload)}
            if path == "/update_weights_from_distributed":
                success, message = self._receiver.update(payload)
                return {"success": success, "message": message, "received": True}
            if path == "/update_weights_from_tensor":  # the sender shares this GPU: CUDA IPC handles
                from relax.distributed.ipc import deserialize, named_tensors

                success, message = self._receiver.load_named(
                    named_tensors(deserialize(payload["serialized_named_tensors"][0])))
                if success and payload.get("weight_version") is not None:
                    self._receiver.version = int(payload["weight_version"])
                return {"success": success, "message": message, "received": True}
            if path == "/destroy_weights_update_group":
                return {"success": True, "message": self._receiver.destroy_group(payload["group_name"])}
        except (ValueError, RuntimeError, KeyError) as exc:
            return {"success": False, "message": f"{type(exc).__name__}: {exc}", "received": False}
        return {"success": True, "message": f"{path}: nothing to do on a training rank"}

    # ---- checkpoints -------------------------------------------------------------------
    def shutdown(self) -> None:
        try:
            self._finish_pending_push()
        except Exception as err:  # noqa: BLE001 - shutting down regardless
            logger.warning("the last background weight push failed: %s", err)
        if self._sender is not None:
            self._run_async(self._sender.close())
        if dist.is_initialized():
            dist.destroy_process_group()
