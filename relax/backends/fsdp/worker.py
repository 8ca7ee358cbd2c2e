"""One data-parallel rank of the `fsdp` training backend (a Ray actor process).

HF `AutoModelForCausalLM` sharded with FSDP2 `fully_shard` per decoder layer (one float32 rank:
the plain module, see `sharded`), AdamW, grad
clipping, micro-batches (fixed or token-budgeted), log-prob passes for the old policy and
the reference, DCP checkpoints, HF export, and the weight push to inference engines. gloo on
CPU, NCCL on GPU. The loss itself is `relax.algorithms.policy_loss` — never re-implemented here.

With `spec.true_on_policy` every forward (log-prob passes and training) scores its rows one at
a time, unpadded, through `relax.algorithms.logprobs` — the function the `hf` engine reports
its log-probs with under `--rl-on-policy-target fsdp` — so both sides agree bitwise.
Role "critic" builds a value model instead: the same causal-LM body with a scalar head
(`AutoModelForTokenClassification`, `num_labels=1`, no dropout; the head is newly initialised
when the checkpoint is a causal LM). Its value for response token t is read at the position
that predicts t, the same position as that token's log-prob, and it trains on
`relax.algorithms.value_loss`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import random
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from relax.algorithms.chunked_logprobs import chunked_token_log_probs
from relax.algorithms.logprobs import row_response_logits, token_log_probs
from relax.algorithms.losses import entropy_from_logits
from relax.algorithms.policy_loss import PolicyLossInputs, PolicyLossOutput, compute_policy_loss
from relax.algorithms.value_loss import ValueLossInputs, compute_value_loss
from relax.backends.base import TrainerSpec
from relax.backends.fsdp.batching import pad_inputs, pad_response, response_positions, split_micro_batches
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


def sharded(world_size: int, bf16: bool) -> bool:
    """Whether the model is wrapped in FSDP2. One float32 rank has nothing to shard, gather or
    cast: wrapping would only add a gather (a copy) per layer per pass and hooks around every
    layer, so it runs as the plain module (same numbers). With --bf16 one rank stays wrapped:
    FSDP's mixed precision is what computes in bfloat16 over float32 master weights."""
    return world_size > 1 or bf16


class ResponseHead:
    """Context manager: for one forward, `head` (the model's output embedding, a Linear without
    bias) returns `[B, T, 2]` = (log-prob, entropy) of the response tokens instead of `[B, L, V]`
    logits. Row b's token t is read at hidden position `index_BT[b, t]` and predicts
    `targets_BT[b, t]`; masked-out slots are 0."""

    def __init__(self, head: torch.nn.Module, index_BT: torch.Tensor, mask_BT: torch.Tensor,
                 targets_BT: torch.Tensor, *, temperature: float, chunk: int | None, entropy: bool,
                 entropy_grad: bool, fused: bool = False):
        if getattr(head, "bias", None) is not None:
            raise ValueError("the chunked log-prob head needs an output layer without bias")
        self.head, self.index_BT, self.mask_BT, self.targets_BT = head, index_BT, mask_BT.bool(), targets_BT
        self.temperature, self.chunk, self.entropy, self.entropy_grad = temperature, chunk, entropy, entropy_grad
        self.fused = fused

    def forward(self, hidden_BLH: torch.Tensor) -> torch.Tensor:
        b, length, h = hidden_BLH.shape
        rows_B1 = torch.arange(b, device=hidden_BLH.device)[:, None] * length
        hidden_NH = hidden_BLH.reshape(b * length, h)[(rows_B1 + self.index_BT)[self.mask_BT]]
        logp_N, ent_N = chunked_token_log_probs(hidden_NH, self.head.weight, self.targets_BT[self.mask_BT],
                                                temperature=self.temperature, chunk=self.chunk,
                                                entropy=self.entropy, fused=self.fused)

        def scatter(values_N: torch.Tensor) -> torch.Tensor:
            return values_N.new_zeros(self.mask_BT.shape).index_put((self.mask_BT,), values_N)

        ent_BT = scatter(ent_N if self.entropy_grad else ent_N.detach()) if ent_N is not None \
            else torch.zeros_like(self.mask_BT, dtype=torch.float32)
        return torch.stack([scatter(logp_N), ent_BT], dim=-1)

    def __enter__(self) -> "ResponseHead":
        self.head.forward = self.forward  # the instance attribute shadows the class's forward
        return self

    def __exit__(self, *exc: object) -> None:
        del self.head.forward


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


class FSDPTrainWorker:
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
    def _seed(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)

    def _build_model(self, path: str) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

        dtype = torch.float32
        if self.spec.role == "critic":
            config = AutoConfig.from_pretrained(path, num_labels=1)
            config.classifier_dropout = 0.0  # a value head is a regression: no dropout
            model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model = model.to(self.device)
        self.hf_config = model.config
        self.pad_id = model.config.pad_token_id or 0
        if self.spec.role not in TRAINABLE_ROLES:
            model.requires_grad_(False)
        if self.spec.recompute_layers is not None and self.spec.role in TRAINABLE_ROLES:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2's name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            keep = self.spec.recompute_layers
            for layer in model.model.layers[keep:] if keep >= 0 else []:
                layer.gradient_checkpointing = False  # --recompute-method block: only the first k
        if self.spec.compile_layers and self.device.type == "cuda":
            for layer in model.model.layers:  # before FSDP wraps it, as torchtitan does
                layer.compile(dynamic=True)
        elif self.spec.compile_layers:
            logger.warning("--use-torch-compile applies to GPU ranks; this rank runs on %s uncompiled", self.device)
        if sharded(self.world_size, self.spec.optim.bf16):
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if self.spec.optim.bf16 else None)
            # One rank: keep each layer's gathered (bf16) parameters from forward to backward
            # instead of gathering and casting them again; there is no shard to save memory on.
            reshard = self.world_size > 1
            for layer in model.model.layers:
                fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
        self._apply_freezing(model)
        return model

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
        params = [p for p in self.model.parameters() if p.requires_grad]
        # On GPUs the fused kernel: one launch per parameter group instead of several per tensor.
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                                           weight_decay=o.weight_decay, fused=self.device.type == "cuda")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o, self.spec.total_steps))

    # ---- forward passes ----------------------------------------------------------------
    def _forward(self, tokens: list[list[int]], response_lengths: list[int], *, entropy: bool = False,
                 entropy_grad: bool = False):
        """Response-aligned `logp_BT`, `mask_BT` (and `entropy_BT`) at the rollout temperature.

        The model's output layer is swapped for the chunked log-prob head for this forward
        (`ResponseHead`): no [B, L, V] logits are built, only the response tokens' log-probs
        (and entropies, detached unless `entropy_grad`). The forward still goes through the
        model's own `__call__`, so FSDP's hooks see the outputs and inputs they expect."""
        if self.spec.true_on_policy:
            return self._forward_rows(tokens, response_lengths, entropy=entropy)
        ids_BL, attn_BL = pad_inputs(tokens, self.pad_id)
        ids_BL, attn_BL = ids_BL.to(self.device), attn_BL.to(self.device)
        index_BT, mask_BT = response_positions([len(t) for t in tokens], response_lengths)
        # Padded positions of short responses may point past the row; clamp, the mask zeroes them.
        index_BT = index_BT.clamp(max=ids_BL.shape[1] - 2).to(self.device)
        mask_BT = mask_BT.to(self.device)
        targets_BT = ids_BL[:, 1:].gather(1, index_BT)
        head = ResponseHead(self.model.get_output_embeddings(), index_BT, mask_BT, targets_BT,
                             temperature=self.spec.temperature, chunk=self.spec.batch.log_probs_chunk_size,
                             entropy=entropy, entropy_grad=entropy_grad,
                             fused=self.spec.compile_layers and self.device.type == "cuda")
        with head:
            out_BTK = self.model(input_ids=ids_BL, attention_mask=attn_BL, use_cache=False).logits
        return out_BTK[..., 0], mask_BT, out_BTK[..., 1] if entropy else None

    def _forward_rows(self, tokens: list[list[int]], response_lengths: list[int], *, entropy: bool = False):
        """`_forward` for true on-policy: one unpadded forward per row (the engine's computation),
        right-padded afterwards to `[B, T]` (padding after the fact changes no value)."""
        width = max(max(response_lengths), 1)
        logps, ents = [], []
        for toks, n in zip(tokens, response_lengths):
            logits_RV = row_response_logits(self.model, toks, n, self.spec.temperature, self.device)
            logps.append(torch.nn.functional.pad(token_log_probs(logits_RV, toks[len(toks) - n:]), (0, width - n)))
            if entropy:
                ents.append(torch.nn.functional.pad(entropy_from_logits(logits_RV), (0, width - n)))
        _, mask_BT = response_positions([len(t) for t in tokens], response_lengths)
        return torch.stack(logps), mask_BT.to(self.device), torch.stack(ents) if entropy else None

    def _balance_row_forwards(self, num_rows: int) -> None:
        """True on-policy, several ranks: every FSDP forward is a collective (parameter
        all-gathers), so a rank with fewer rows runs throwaway one-token forwards until all ranks
        have run as many as the busiest one."""
        if self.world_size == 1:
            return
        most = torch.tensor([num_rows], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        for _ in range(int(most) - num_rows):
            self.model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device), use_cache=False)
    def _values(self, tokens: list[list[int]], response_lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Critic: response-aligned `values_BT` and `mask_BT` (value of the state each token is chosen in)."""
        ids_BL, attn_BL = pad_inputs(tokens, self.pad_id)
        values_BL = self.model(input_ids=ids_BL.to(self.device), attention_mask=attn_BL.to(self.device),
                               use_cache=False).logits[..., 0].float()
        index_BT, mask_BT = response_positions([len(t) for t in tokens], response_lengths)
        index_BT = index_BT.clamp(max=values_BL.shape[1] - 1).to(self.device)
        mask_BT = mask_BT.to(self.device)
        return values_BL.gather(1, index_BT) * mask_BT, mask_BT

    def _micro_batches(self, lengths: list[int], max_tokens: int | None) -> list[list[int]]:
        b = self.spec.batch
        return split_micro_batches(lengths, micro_batch_size=b.micro_batch_size,
                                   max_tokens=max_tokens if b.use_dynamic_batch_size else None)

    @torch.no_grad()
    def compute_log_probs(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]:
        """Per-row response log-probs under the current weights (old policy or reference)."""
        self.model.eval()
        start = time.perf_counter()
        budget = self.spec.batch.log_probs_max_tokens_per_gpu or self.spec.batch.max_tokens_per_gpu
        out: list[list[float]] = [[] for _ in tokens]
        for idx in self._micro_batches([len(t) for t in tokens], budget):
            logp_BT, _, _ = self._forward([tokens[i] for i in idx], [lengths[i] for i in idx])
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
            values_BT, _ = self._values([tokens[i] for i in idx], [lengths[i] for i in idx])
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
            if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP: reduce-scatter on the last micro-batch only
                self.model.set_requires_gradient_sync(p.micro == len(micro) - 1)
            out = self._micro_loss(p.batch, micro[p.micro], num_samples=len(rows),
                                   num_tokens=p.global_tokens[p.step] / self.world_size)
            out.loss.backward()
            for k, v in out.metrics.items():
                p.sums[k] = reduce_metric(out.reduce_ops.get(k, "sum"), p.sums.get(k), float(v))
            p.micro, ran = p.micro + 1, ran + 1
            if p.micro == len(micro):
                metrics = self._optimizer_step(p.sums)
                for k, v in metrics.items():
                    op = "max" if k.endswith("_max") else "min" if k.endswith("_min") else "sum"
                    p.totals[k] = reduce_metric(op, p.totals.get(k), v if op != "sum" else v / len(p.plan))
                p.step, p.micro, p.sums = p.step + 1, 0, {}
        self.compute_seconds += time.perf_counter() - start
        return ran

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

    def _optimizer_step(self, sums: dict[str, float]) -> dict[str, float]:
        clip = self.spec.optim.clip_grad
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
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
        cfg = self.spec.loss
        lengths = [batch.response_lengths_R[i] for i in rows]
        # Entropy is always reported; it carries a gradient only into a loss that can use it.
        logp_BT, mask_BT, ent_BT = self._forward([batch.tokens_RL[i] for i in rows], lengths, entropy=True,
                                                 entropy_grad=cfg.entropy_coef != 0 or bool(self.spec.custom_loss_path))
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
    def _full_state(self, dtype: torch.dtype | None = None):
        """(name, full tensor, fresh) for every parameter; a collective, so every rank iterates.
        `dtype`: floating tensors are cast first (a sharded one before its gather: half the bytes
        for bf16); `fresh` says the tensor is a copy, not the parameter's own memory."""
        for name, p in self.model.named_parameters():
            t = p.detach()
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
            full = t.full_tensor() if hasattr(t, "full_tensor") else t
            own = p.to_local() if hasattr(p, "to_local") else p
            yield name, full, full.data_ptr() != own.data_ptr()

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
    def receive_weights(self, path: str, payload: dict) -> dict[str, Any]:
        """The receiving side of SGLang's weight-update protocol, reached through a Ray handle.

        Pause/flush/continue are no-ops: this actor runs one call at a time, so no forward pass
        overlaps a load. `received` tells the sender whether the bucket's bytes were consumed."""
        from relax.backends.fsdp.weights import ShardedWeightReceiver

        if self._receiver is None:
            self._receiver = ShardedWeightReceiver(self.model, device=self.device, timeout_s=self.spec.sync_timeout_s)
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

    def weight_version(self) -> int | None:
        return None if self._receiver is None else self._receiver.version

    # ---- checkpoints -------------------------------------------------------------------
    def save(self, ckpt_dir: str, rollout_id: int, save_optim: bool = True) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        path = Path(ckpt_dir)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer or [])
        state = {"model": model_sd}
        if save_optim and self.optimizer is not None:
            state["optim"] = optim_sd
        dcp.save(state, checkpoint_id=str(path / "model"))
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                   path / f"rng_rank{self.rank}.pt")
        if self.rank == 0:
            meta = {"rollout_id": rollout_id, "train_step": self.step, "has_optim": "optim" in state,
                    "world_size": self.world_size,
                    "scheduler": self.scheduler.state_dict() if self.scheduler else None, "time": time.time()}
            (path / "meta.json").write_text(json.dumps(meta))
        dist.barrier()

    def load(self, ckpt_dir: str) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        path = Path(ckpt_dir)
        meta = json.loads((path / "meta.json").read_text())
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer or [])
        state = {"model": model_sd}
        if meta["has_optim"] and self.optimizer is not None:
            state["optim"] = optim_sd
        dcp.load(state, checkpoint_id=str(path / "model"))
        set_state_dict(self.model, self.optimizer or [], model_state_dict=state["model"],
                       optim_state_dict=state.get("optim", {}))
        if self.scheduler is not None and meta.get("scheduler"):
            self.scheduler.load_state_dict(meta["scheduler"])
        rng_file = path / f"rng_rank{self.rank}.pt"
        if not rng_file.exists():  # resuming without it would change every later sample
            saved = meta.get("world_size", "?")
            raise FileNotFoundError(f"{rng_file} is missing (the checkpoint was saved by {saved} ranks, this "
                                    f"group has {self.world_size}): resume with the same number of ranks "
                                    "from a complete checkpoint")
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if rng.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.step = meta["train_step"]
        return meta

    def load_weights(self, ckpt_dir: str) -> None:
        """Load only the model weights of a checkpoint written by `save` (any world size)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        state = {"model": get_model_state_dict(self.model)}
        dcp.load(state, checkpoint_id=str(Path(ckpt_dir) / "model"))
        set_model_state_dict(self.model, state["model"])

    def export_hf(self, out_dir: str, tokenizer_path: str) -> None:
        """Write an HF checkpoint loadable by `AutoModelForCausalLM.from_pretrained`."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from transformers import AutoModelForCausalLM, AutoTokenizer

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            model = AutoModelForCausalLM.from_config(self.hf_config)
            model.load_state_dict(full, strict=False)
            model.tie_weights()
            model.save_pretrained(out_dir, safe_serialization=True)
            AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(out_dir)
        dist.barrier()

    def shutdown(self) -> None:
        try:
            self._finish_pending_push()
        except Exception as err:  # noqa: BLE001 - shutting down regardless
            logger.warning("the last background weight push failed: %s", err)
        if self._sender is not None:
            self._run_async(self._sender.close())
        if dist.is_initialized():
            dist.destroy_process_group()
