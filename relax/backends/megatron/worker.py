"""One rank of the `megatron` training backend (a Ray actor process): a megatron-core `GPTModel`.

The model is built from the HF checkpoint's `config.json` (`model.py`) and its weights converted
from the checkpoint's safetensors (`convert.py`), sharded for this rank's place in the
tensor / pipeline / expert-parallel layout (`--tensor-model-parallel-size`,
`--pipeline-model-parallel-size`, `--expert-model-parallel-size`, `--sequence-parallel`); data
parallelism is what is left of the world (after `--context-parallel-size` too). The rows of a shard
reach every rank of its tensor-parallel group; each computes the same loss from vocabulary-
parallel log-probs (`head.py`) and the backend-agnostic half (`relax.backends.train_worker`)
trains it: the same micro-batches, losses and optimizer steps as the fsdp backend. Gradients
are averaged over data-parallel ranks before the step (expert weights over their expert-data-
parallel group), the gradient norm counts every weight once across tensor/expert shards.

Weights out: the tensor- and expert-parallel shards are gathered into full Megatron tensors by
the ranks of data-parallel shard 0 and converted to HF names on rank 0, which alone sends them
to the engines through the weight-sync protocol (same buckets, deadline and errors as fsdp).

On a CPU (gloo, float32) `cpu_shim` covers megatron-core's CUDA-only spots; torch's AdamW is the
optimizer on both (megatron's is CUDA-only), sharded over data-parallel ranks with
--use-distributed-optimizer (torch's ZeroRedundancyOptimizer).
Context parallelism (`--context-parallel-size`, with data parallelism): each row's tokens split
into 2C chunks, two per rank (`attention.py`), every rank of the group computing the whole loss
from log-probs summed over it (`head.py`), gradients summed over it.
The critic (role "critic"): the same model with a scalar value head in place of the language-model
head (`_add_value_head`, `head.py: MegatronValueHead`), trained on the shared value loss.
Weights in (fully async: ActorFwd ranks take the actor's pushes): each rank receives the HF-named
buckets, fuses them with the raw converters and keeps its own shards (`weights.py`).
A vision-language or omni model (Qwen2.5-VL, Qwen3-VL, the Qwen3-Omni thinker): the language model
as above with M-RoPE, the checkpoint's encoders beside it, whole on every rank; micro-batches with
media feed the decoder the word embeddings with the encoders' features in place (`vision.py`).
Not built yet, and rejected by validation with that message: the critic under pipeline
parallelism; media under pipeline or context parallelism.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from relax.backends.batching import pad_inputs, response_positions
from relax.backends.megatron import compile_shim, cpu_shim
from relax.backends.megatron.attention import cp_causal_mask, cp_positions
from relax.backends.megatron.convert import (
    Layout, expert_range, global_name, hf_to_megatron, hf_tensors, shard_state, stage_layers, tp_dim, tp_merge,
)
from relax.backends.megatron.head import MegatronResponseHead, MegatronValueHead
from relax.backends.megatron.model import (
    build_gpt, check_arch_flags, read_hf_state, rope_theta, transformer_config,
)
from relax.backends.megatron.vision import TOWER_PREFIXES, VisionSide, check_supported, split_state
from relax.backends.megatron.weights import MegatronWeightReceiver
from relax.backends.train_worker import TRAINABLE_ROLES, TrainWorkerBase, lr_lambda, reduce_metric
from relax.utils.multimodal.processor import collate, from_bytes

logger = logging.getLogger(__name__)

_EXPERT_KEY = ".mlp.experts."


def is_expert(name: str) -> bool:
    return _EXPERT_KEY in name


class MegatronTrainWorker(TrainWorkerBase):
    """megatron-core GPTModel, tensor / expert / sequence parallel, data-parallel over the rest."""

    # ---- setup -------------------------------------------------------------------------
    def _setup_parallel(self) -> None:
        from megatron.core import parallel_state as ps

        cpu_shim.apply()
        mp = self.spec.model_parallel
        if mp.cp > 1 and mp.pp > 1:
            raise NotImplementedError(
                f"--context-parallel-size {mp.cp} with --pipeline-model-parallel-size {mp.pp}: the megatron backend "
                "does not run context and pipeline parallelism together yet; set one of them to 1")
        if self.world_size % (mp.tp * mp.pp * mp.cp):
            raise ValueError(f"{self.world_size} ranks do not split into tensor x pipeline x context parallel "
                             f"groups of {mp.tp} x {mp.pp} x {mp.cp}")
        ps.initialize_model_parallel(tensor_model_parallel_size=mp.tp, pipeline_model_parallel_size=mp.pp,
                                     context_parallel_size=mp.cp, expert_model_parallel_size=mp.ep,
                                     expert_tensor_parallel_size=1)  # experts whole on each rank
        self.ps = ps
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.tp_rank, self.tp_size = ps.get_tensor_model_parallel_rank(), mp.tp
        self.ep_rank, self.ep_size = ps.get_expert_model_parallel_rank(), mp.ep
        self.pp_rank, self.pp_size = ps.get_pipeline_model_parallel_rank(), mp.pp
        self.cp_rank, self.cp_size = ps.get_context_parallel_rank(), mp.cp
        self._pad_to = (0, 0)  # (rows, length) every micro-batch is padded to (a pipeline schedule's)
        self.first_stage, self.last_stage = self.pp_rank == 0, self.pp_rank == mp.pp - 1

    def parallel_info(self) -> dict[str, Any]:
        return {"dp_rank": self.dp_rank, "dp_size": self.dp_size,
                "output": self.tp_rank == 0 and self.cp_rank == 0 and self.last_stage}

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        # Every rank of a tensor-parallel group draws the same numbers (it computes the same rows).
        cpu_shim.seed_model_parallel(seed - self.rank + self.dp_rank)

    def _build_model(self, path: str) -> torch.nn.Module:
        from transformers import AutoConfig

        if self.spec.role == "critic" and self.spec.model_parallel.pp > 1:
            raise NotImplementedError(f"the megatron critic does not run pipeline parallelism yet: "
                                      f"--pipeline-model-parallel-size {self.spec.model_parallel.pp}; use 1")
        from relax.utils.multimodal.processor import is_multimodal

        hf_config = AutoConfig.from_pretrained(path)
        mp = self.spec.model_parallel
        self.vision = None  # a VL model's tower, positions and names (vision.py)
        if is_multimodal(hf_config):
            check_supported(hf_config, mp.pp, mp.cp)
            self.vision = VisionSide(hf_config)
        text_config = hf_config.text_config if self.vision else hf_config
        self.hf_config, self.pad_id = hf_config, text_config.pad_token_id or 0
        self.layout = layout = Layout.from_hf_config(text_config)
        check_arch_flags(mp.arch_flags, layout, text_config, path)
        if layout.vocab_size % mp.tp:
            raise ValueError(f"vocab size {layout.vocab_size} does not split over --tensor-model-parallel-size "
                             f"{mp.tp}; pick a size that divides it")
        if layout.num_experts and mp.tp > 1 and not mp.sequence_parallel:
            raise ValueError("an MoE model with --tensor-model-parallel-size > 1 needs --sequence-parallel "
                             "(megatron-core's rule)")
        if mp.ep > 1 and not layout.num_experts:
            raise ValueError(f"--expert-model-parallel-size {mp.ep} needs an MoE model; {path} is dense")
        self.layers = stage_layers(layout.num_layers, mp.pp, mp.first_stage_layers, mp.last_stage_layers)[self.pp_rank]
        self.config = transformer_config(layout, mp, bf16=self.spec.optim.bf16, norm_eps=text_config.rms_norm_eps)
        self.experts = expert_range(layout.num_experts, mp.ep, self.ep_rank) if layout.num_experts else None
        model = build_gpt(layout, self.config, pre_process=self.first_stage, post_process=self.last_stage,
                          rope_theta=rope_theta(text_config), num_layers=len(self.layers),
                          max_positions=getattr(text_config, "max_position_embeddings", 4096))
        hf_state = read_hf_state(path)
        if self.vision:
            hf_state, tower_states = split_state(hf_state)
            for tower, module in self.vision.build_towers(tower_states).items():
                setattr(model, tower, module)
            self.vision.install(model)
        if self.spec.role == "critic":
            self._add_value_head(model, hf_state)
        self._load_hf(model, hf_state)
        model = model.to(self.device)
        if self.spec.compile_layers and self.device.type == "cuda":  # --use-torch-compile, as fsdp does
            compile_shim.compile_layers(model.decoder.layers)  # one graph per layer (compile_shim.py)
        if self.spec.role not in TRAINABLE_ROLES:
            model.requires_grad_(False)
        self._apply_freezing(model)
        self._main = self._main_weights(model) if self.spec.optim.bf16 else {}
        return model

    def _add_value_head(self, model: torch.nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
        """Critic: a scalar head (hidden -> 1, with bias) on the final norm's output, as the fsdp
        critic's `score` (`AutoModelForTokenClassification`, `num_labels=1`): read from the
        checkpoint's `score.*` when it has them (a critic checkpoint), else initialised as
        transformers initialises it (normal(0, initializer_range), bias 0). The language-model
        head is not used: an untied one is frozen (zeros when the checkpoint has none)."""
        head = torch.nn.Linear(self.layout.hidden_size, 1)
        with torch.no_grad():
            if "score.weight" in hf_state:
                head.weight.copy_(hf_state.pop("score.weight"))
                head.bias.copy_(hf_state.pop("score.bias", torch.zeros(1)))
            else:
                # Every rank draws the same head (data-parallel ranks are seeded apart).
                g = torch.Generator().manual_seed(self.spec.optim.seed)
                head.weight.normal_(0.0, getattr(self.hf_config, "initializer_range", 0.02), generator=g)
                head.bias.zero_()
        model.value_head = head
        if not self.layout.tied:
            hf_state.setdefault("lm_head.weight", torch.zeros(self.layout.vocab_size, self.layout.hidden_size))
            model.output_layer.weight.requires_grad_(False)

    def _main_weights(self, model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        """--bf16: the model computes with bfloat16 weights (megatron-core's linear layers run their
        backward GEMMs outside autocast: in float32 under autocast, 40% of a step's GPU time on an
        H100); float32 main weights, which the optimizer steps, keep the precision. Each backward
        adds a weight's bfloat16 gradient into its main weight's float32 gradient (accumulated over
        micro-batches in float32) and frees it; after each step the main weights are cast back."""
        main: dict[str, torch.nn.Parameter] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            main[name] = torch.nn.Parameter(p.detach().float().clone())

            def accumulate(param: torch.Tensor, target: torch.nn.Parameter = main[name]) -> None:
                grad = param.grad.float()
                target.grad = grad if target.grad is None else target.grad.add_(grad)
                param.grad = None

            p.register_post_accumulate_grad_hook(accumulate)
        model.bfloat16()
        return main

    def _optimized_parameters(self) -> list[torch.nn.Parameter]:
        return list(self._main.values()) if self._main else super()._optimized_parameters()

    def _build_optimizer(self) -> None:
        """AdamW; with --use-distributed-optimizer its state is sharded over the data-parallel
        ranks (ZeRO-1, torch's `ZeroRedundancyOptimizer`: each rank steps its share of the weights
        and the updated weights are broadcast from their owners)."""
        super()._build_optimizer()
        if not self.spec.model_parallel.distributed_optimizer or self.dp_size == 1:
            return
        from torch.distributed.optim import ZeroRedundancyOptimizer

        o = self.spec.optim
        self.optimizer = ZeroRedundancyOptimizer(
            self._optimized_parameters(), optimizer_class=torch.optim.AdamW,
            process_group=self.ps.get_data_parallel_group(), lr=o.lr, betas=(o.adam_beta1, o.adam_beta2),
            eps=o.adam_eps, weight_decay=o.weight_decay, fused=self.device.type == "cuda")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(o, self.spec.total_steps))

    def _optimizer_state(self) -> Any:
        """This rank's optimizer state (its own shard under --use-distributed-optimizer)."""
        return getattr(self.optimizer, "optim", self.optimizer)

    def _grads(self) -> Iterator[tuple[str, torch.nn.Parameter, torch.Tensor]]:
        """(name, model weight, its gradient) of every weight with one (the main weight's under --bf16)."""
        for name, p in self.model.named_parameters():
            grad = self._main[name].grad if name in self._main else p.grad
            if grad is not None:
                yield name, p, grad

    def _optimizer_step(self, sums: dict[str, float]) -> dict[str, float]:
        metrics = super()._optimizer_step(sums)
        if self._main:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    if name in self._main:
                        p.copy_(self._main[name])
        return metrics

    def _move_state(self, device: torch.device) -> None:
        super()._move_state(device)
        for m in self._main.values():
            m.data = m.data.to(device)

    def _shard(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full Megatron tensors under global names -> this rank's local state (its shards only)."""
        return shard_state(full, tp=self.tp_size, tp_rank=self.tp_rank, layers=self.layers, experts=self.experts,
                           first_stage=self.first_stage, last_stage=self.last_stage, tied=self.layout.tied)

    def _load_hf(self, model: torch.nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
        local = self._shard(hf_to_megatron(hf_state, self.layout))
        result = model.load_state_dict(local, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")
                   and not k.startswith(("value_head.", *TOWER_PREFIXES))]  # the critic's head, the encoders: apart
        if missing or result.unexpected_keys:
            raise RuntimeError(f"the converted checkpoint does not fit the Megatron model: missing {missing[:5]}, "
                               f"unexpected {result.unexpected_keys[:5]}")

    # ---- forward passes ----------------------------------------------------------------
    def _micro_batches(self, lengths: list[int], max_tokens: int | None) -> list[list[int]]:
        """Under context parallelism a rank holds 1/C of a micro-batch's tokens: --max-tokens-per-gpu
        bounds each rank's share (C times as many tokens per micro-batch)."""
        return super()._micro_batches(lengths, max_tokens * self.cp_size if max_tokens else max_tokens)

    def _lockstep_group(self):
        """Expert parallelism exchanges tokens inside every forward: the expert group's ranks (each
        with its own rows) run as many micro-batches."""
        return self.ps.get_expert_model_parallel_group() if self.ep_size > 1 else None

    def _forward(self, tokens: list[list[int]], response_lengths: list[int], *, entropy: bool = False,
                 entropy_grad: bool = False, media: list[bytes] | None = None):
        """Response-aligned `logp_BT`, `mask_BT` (and `entropy_BT`) at the rollout temperature
        (one stage: pipeline parallelism goes through `_pipeline`). `media`: the rows' encoder
        tensors (a VL model: `vision.py`)."""
        if media and any(media) and self.vision is None:
            raise ValueError(f"rows with media, but {self.spec.model_path} is a text model")
        if self.spec.true_on_policy:
            raise NotImplementedError("--true-on-policy-mode runs on the fsdp backend")
        with self._micro_batch(tokens, response_lengths, entropy=entropy, entropy_grad=entropy_grad,
                               media=media) as run:
            return run.outputs(run.call(self.model))

    def _micro_batch(self, tokens: list[list[int]], response_lengths: list[int], *, entropy: bool,
                     entropy_grad: bool, values: bool = False, media: list[bytes] | None = None) -> "_MicroBatch":
        """One micro-batch's inputs and the head its forward returns through: response log-probs
        (and entropies), or a critic's `values` (`[B, T, 1]`). A VL model's micro-batch carries
        its rows' encoder tensors and M-RoPE positions (`vision.py`)."""
        ids_BL, _ = pad_inputs(tokens, self.pad_id)
        index_BT, mask_BT = response_positions([len(t) for t in tokens], response_lengths)
        rows = len(tokens)
        ids_BL, index_BT, mask_BT = self._common_shape(ids_BL, index_BT, mask_BT)
        ids_BL = ids_BL.to(self.device)
        b, length = ids_BL.shape
        index_BT = index_BT.clamp(max=length - 2).to(self.device)  # padded slots: the mask zeroes them
        mask_BT = mask_BT.to(self.device)
        targets_BT = ids_BL[:, 1:].gather(1, index_BT)
        position_BL = torch.arange(length, device=self.device)[None].expand(b, -1)
        # Right padding under a causal mask: no real token attends to a pad (megatron's default
        # causal mask is built on "cuda", so the mask is passed).
        causal_11LL = torch.triu(torch.ones(length, length, dtype=torch.bool, device=self.device), 1)[None, None]
        head_index_BT, head_mask_BT = index_BT, mask_BT
        if self.cp_size > 1:  # this rank's chunks of every row (attention.py: cp_positions)
            ids_BL, position_BL, causal_11LL, head_index_BT, head_mask_BT = self._cp_shard(ids_BL, index_BT, mask_BT)
        head: Any = None
        cp_group = self.ps.get_context_parallel_group() if self.cp_size > 1 else None
        if values:
            head = MegatronValueHead(self.model.output_layer, self.model.value_head, head_index_BT, head_mask_BT,
                                     tp_group=self.ps.get_tensor_model_parallel_group(),
                                     sequence_parallel=self.config.sequence_parallel, cp_group=cp_group)
        elif self.last_stage:
            head = MegatronResponseHead(
                self.model.output_layer, head_index_BT, head_mask_BT, targets_BT, temperature=self.spec.temperature,
                chunk=self.spec.batch.log_probs_chunk_size, entropy=entropy, entropy_grad=entropy_grad,
                tp_group=self.ps.get_tensor_model_parallel_group(), tp_rank=self.tp_rank, tp_size=self.tp_size,
                sequence_parallel=self.config.sequence_parallel, cp_group=cp_group,
                fused=self.spec.compile_layers and self.device.type == "cuda")  # --use-torch-compile, as fsdp
        autocast = self.spec.optim.bf16 and not self._main  # a scoring rank's float32 weights under --bf16
        run = _MicroBatch(ids_BL, position_BL, causal_11LL, mask_BT, rows, head, entropy, autocast)
        if self.vision is not None:  # M-RoPE positions [3, B, L] (rows given without media: text positions)
            run.position_BL = position_BL[None].expand(3, -1, -1)
            if media is not None:
                real_BL = torch.zeros_like(ids_BL, dtype=torch.bool)
                for i, t in enumerate(tokens):
                    real_BL[i, :len(t)] = True
                tensors = {k: v.to(self.device) for k, v in collate([from_bytes(m) for m in media]).items()}
                run.position_BL = self.vision.positions(ids_BL, real_BL, tensors)
                if tensors:
                    run.embed = lambda model: self.vision.embed(model, ids_BL, tensors, self.config.sequence_parallel)
        return run

    def _cp_shard(self, ids_BL: torch.Tensor, index_BT: torch.Tensor, mask_BT: torch.Tensor):
        """Context parallelism: this rank's share of a micro-batch padded to a multiple of 2C.
        Returns its tokens `ids_BS` and their global positions `position_BS` (S = L / C; RoPE is
        cut to them by megatron-core itself), the attention mask over the all-gathered keys
        `[1, 1, S, L]`, and where the response tokens it holds are read (`index_BT` local,
        `mask_BT` of those it holds)."""
        b, length = ids_BL.shape
        positions_S = cp_positions(length, self.cp_size, self.cp_rank).to(self.device)
        local_L = torch.full((length,), -1, dtype=torch.long, device=self.device)
        local_L[positions_S] = torch.arange(len(positions_S), device=self.device)
        local_BT = local_L[index_BT]
        mask_11SL = cp_causal_mask(length, self.cp_size, self.cp_rank).to(self.device)
        return (ids_BL[:, positions_S], positions_S[None].expand(b, -1), mask_11SL, local_BT.clamp(min=0),
                mask_BT * (local_BT >= 0))

    # ---- pipeline parallelism ------------------------------------------------------------
    def _pipeline(self, micro: list[tuple[list[list[int]], list[int]]], *, loss: Any = None,
                  entropy: bool = False, entropy_grad: bool = False) -> list[Any]:
        """Run micro-batches (token lists, response lengths) through the pipeline stages with
        megatron-core's 1F1B schedule (forward only without `loss`). The last stage returns, per
        micro-batch, `loss(k, logp_BT, mask_BT, ent_BT)` (a PolicyLossOutput; its loss goes
        backward) or (logp_BT, mask_BT); the other stages an empty list."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        results: list[Any] = []

        def step(data_iterator: Any, model: Any):
            k = next(data_iterator)
            run = self._micro_batch(*micro[k], entropy=entropy, entropy_grad=entropy_grad)
            with run:
                out = run.call(model)

            def loss_func(out_BTK: torch.Tensor):
                logp_BT, mask_BT, ent_BT = run.outputs(out_BTK)
                if loss is None:
                    results.append((logp_BT.detach(), mask_BT))
                    return out_BTK.sum() * 0.0, 1, {}
                result = loss(k, logp_BT, mask_BT, ent_BT)
                results.append(result)
                return result.loss, 1, {}  # already normalised by the step's tokens: no rescaling

            return out, loss_func

        # One activation shape for the whole schedule: every micro-batch padded to the largest.
        length, multiple = max(max(len(x) for x in toks) for toks, _ in micro), self._length_multiple()
        self._pad_to = (max(len(t) for t, _ in micro), -(-length // multiple) * multiple)
        try:
            with cpu_shim.cuda_to_cpu():
                get_forward_backward_func()(
                    forward_step_func=step, data_iterator=iter(range(len(micro))), model=[self.model],
                    num_microbatches=len(micro), seq_length=self._pad_to[1], micro_batch_size=self._pad_to[0],
                    forward_only=loss is None)
        finally:
            self._pad_to = (0, 0)
        return results

    @torch.no_grad()
    def compute_log_probs(self, tokens: list[list[int]], lengths: list[int],
                          media: list[bytes] | None = None) -> list[list[float]]:
        if self.pp_size == 1:
            return super().compute_log_probs(tokens, lengths, media)
        self.model.eval()
        start = time.perf_counter()
        budget = self.spec.batch.log_probs_max_tokens_per_gpu or self.spec.batch.max_tokens_per_gpu
        micro = self._micro_batches([len(t) for t in tokens], budget)
        results = self._pipeline([self._rows_of(idx, tokens, lengths) for idx in micro])
        out: list[list[float]] = [[] for _ in tokens]
        for idx, (logp_BT, _) in zip(micro, results):  # the last stage's; the others return []
            for row, i in enumerate(idx):
                out[i] = logp_BT[row, : lengths[i]].cpu().tolist()
        self.compute_seconds += time.perf_counter() - start
        return out

    def train_rows(self, positions: list[int], rows: Any) -> int:
        """Pipeline parallelism: a step runs once all its rows are in, every micro-batch through
        the 1F1B schedule, then the optimizer step (one stage: the base class's micro-batch loop)."""
        if self.pp_size == 1:
            return super().train_rows(positions, rows)
        p = self._pass
        if p is None:
            raise RuntimeError("train_rows before train_begin")
        if p.batch is None:
            p.batch = type(rows).empty(p.num_rows, rows.present())
        p.batch.put(positions, rows)
        p.arrived.update(positions)
        start, ran = time.perf_counter(), 0
        while p.step < len(p.plan) and all(i in p.arrived for m in p.plan[p.step] for i in m):
            micro, batch = p.plan[p.step], p.batch
            num_samples, num_tokens = sum(map(len, micro)), p.global_tokens[p.step] / self.dp_size
            self.optimizer.zero_grad(set_to_none=True)

            def loss(k: int, logp_BT: torch.Tensor, mask_BT: torch.Tensor, ent_BT: torch.Tensor | None):
                return self._policy_loss(batch, micro[k], logp_BT, mask_BT, ent_BT, num_samples=num_samples,
                                         num_tokens=num_tokens)

            outs = self._pipeline([([batch.tokens_RL[i] for i in m], [batch.response_lengths_R[i] for i in m])
                                   for m in micro], loss=loss, entropy=True, entropy_grad=self._entropy_grad())
            for out in outs:
                for k, v in out.metrics.items():
                    p.sums[k] = reduce_metric(out.reduce_ops.get(k, "sum"), p.sums.get(k), float(v))
            self._end_step(p)
            ran += len(micro)
        self.compute_seconds += time.perf_counter() - start
        return ran

    def _common_shape(self, ids_BL: torch.Tensor, index_BT: torch.Tensor, mask_BT: torch.Tensor):
        """Pad a micro-batch to the shape every rank of its expert group runs (the all-gather token
        dispatcher exchanges equal-sized blocks), at least to `_pad_to` (a pipeline schedule's one
        activation shape), its length to a multiple of the tensor-parallel size under
        --sequence-parallel (the sequence is split over those ranks) and of 2C under context
        parallelism (2C chunks). Extra rows are padding with an empty response."""
        (b, length), t = ids_BL.shape, index_BT.shape[1]
        b, length = max(b, self._pad_to[0]), max(length, self._pad_to[1])
        shape = torch.tensor([b, length, t], device=self.device)  # NCCL groups take CUDA tensors only
        if self.ep_size > 1:
            dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=self.ps.get_expert_model_parallel_group())
        b2, length2, t2 = shape.tolist()
        multiple = self._length_multiple()
        length2 = -(-length2 // multiple) * multiple
        (b, length), t = ids_BL.shape, index_BT.shape[1]
        if (b2, length2, t2) == (b, length, t):
            return ids_BL, index_BT, mask_BT
        pad = torch.nn.functional.pad
        return (pad(ids_BL, (0, length2 - length, 0, b2 - b), value=self.pad_id),
                pad(index_BT, (0, t2 - t, 0, b2 - b)), pad(mask_BT, (0, t2 - t, 0, b2 - b)))

    def _length_multiple(self) -> int:
        """What a micro-batch's length is padded to a multiple of: the sequence is split over the
        tensor ranks under --sequence-parallel, and into 2C chunks under context parallelism."""
        return (self.tp_size if self.config.sequence_parallel else 1) * (2 * self.cp_size if self.cp_size > 1 else 1)

    def _values(self, tokens: list[list[int]], response_lengths: list[int]):
        """Critic: response-aligned `values_BT` and `mask_BT` (the value of the state each response
        token is chosen in, read where its log-prob is: the fsdp critic's positions)."""
        with self._micro_batch(tokens, response_lengths, entropy=False, entropy_grad=False, values=True) as run:
            out_BT1 = run.call(self.model)
        mask_BT = run.mask_BT[:run.rows]
        return out_BT1[:run.rows, :, 0].float() * mask_BT, mask_BT

    # ---- gradients ---------------------------------------------------------------------
    def _reduce_grads(self) -> None:
        """Average over data-parallel ranks: dense weights over the data-parallel group, expert
        weights over their expert-data-parallel group (each expert rank already summed the
        gradients of every token routed to it), both divided by the data-parallel size; with
        --sequence-parallel the norms' partial gradients are summed over the tensor group. Under
        context parallelism each rank's gradient is its chunks' share of the same loss: summed
        over the context-parallel ranks too (megatron's data-parallel-with-CP group, which the
        expert-data-parallel group also spans), still divided by the data-parallel size only."""
        ps = self.ps
        dp_group = ps.get_data_parallel_group(with_context_parallel=True)
        self._align_missing_grads(dp_group)
        tied = self._tied_copy()
        for name, p, grad in self._grads():
            if p is tied:  # first and last stage hold the tied embedding
                dist.all_reduce(grad, group=ps.get_embedding_group())
            partial = (self.config.sequence_parallel and getattr(p, "sequence_parallel", False)) or \
                (self.tp_size > 1 and ("q_layernorm" in name or "k_layernorm" in name))
            if partial:  # q/k norms are shared by the heads, which are split over the tensor group
                dist.all_reduce(grad, group=ps.get_tensor_model_parallel_group())
            if is_expert(name):  # its expert-data-parallel copies (data and, under TP, tensor ranks) saw other tokens
                if ps.get_expert_data_parallel_world_size() > 1:
                    dist.all_reduce(grad, group=ps.get_expert_data_parallel_group())
            elif self.dp_size * self.cp_size > 1:
                dist.all_reduce(grad, group=dp_group)
            if self.dp_size > 1:
                grad.div_(self.dp_size)

    def _align_missing_grads(self, dp_group: Any) -> None:
        """A weight this rank's micro-batches never reached (an encoder, when none of its rows had
        that kind of media) has no gradient while a data-parallel peer's has one: it gets zeros,
        so every rank makes the same all-reduces. Weights no rank reached keep none (the optimizer
        skips them, as it does on one rank)."""
        ps = self.ps
        trainable = [(name, self._main.get(name, p)) for name, p in self.model.named_parameters() if p.requires_grad]
        for experts, group, size in ((False, dp_group, self.dp_size * self.cp_size),
                                     (True, ps.get_expert_data_parallel_group(check_initialized=False),
                                      ps.get_expert_data_parallel_world_size())):
            params = [t for name, t in trainable if is_expert(name) == experts]
            if not params or size <= 1:
                continue
            has = torch.tensor([t.grad is not None for t in params], dtype=torch.int32, device=self.device)
            dist.all_reduce(has, op=dist.ReduceOp.MAX, group=group)
            for t, h in zip(params, has.tolist()):
                if h and t.grad is None:
                    t.grad = torch.zeros_like(t)

    def _tied_copy(self) -> torch.nn.Parameter | None:
        """Under pipeline parallelism with tied embeddings, this stage's copy of the embedding
        (the first stage's input embedding, the last stage's output layer); None otherwise."""
        if self.pp_size == 1 or not self.layout.tied:
            return None
        if self.first_stage:
            return self.model.embedding.word_embeddings.weight
        return self.model.output_layer.weight if self.last_stage else None

    def _clip_grad_norm(self, clip: float) -> float:
        """The norm of the whole model's gradient, each weight counted once: tensor-parallel
        shards summed over the tensor group, replicated weights from tensor rank 0 only, experts
        summed over the expert group."""
        ps = self.ps
        dense = torch.zeros((), dtype=torch.float64, device=self.device)
        expert = torch.zeros((), dtype=torch.float64, device=self.device)
        grads = []
        tied = self._tied_copy()
        for name, p, grad in self._grads():
            grads.append(grad)
            if tied is p and not self.first_stage:
                continue  # counted once, on the first stage
            sq = grad.double().pow(2).sum()
            sharded = getattr(p, "tensor_model_parallel", False)
            if is_expert(name):
                if self.tp_rank == 0:
                    expert += sq
            elif sharded or self.tp_rank == 0:
                dense += sq
        if self.tp_size > 1:
            dist.all_reduce(dense, group=ps.get_tensor_model_parallel_group())
        if self.ep_size > 1:
            dist.all_reduce(expert, group=ps.get_expert_model_parallel_group())
        if self.tp_size > 1 and self.layout.num_experts:
            dist.all_reduce(expert, group=ps.get_tensor_model_parallel_group())
        total = dense + expert
        if self.pp_size > 1:
            dist.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
        norm = float(total.sqrt())
        if clip > 0 and norm == norm:
            coef = clip / (norm + 1e-6)
            if coef < 1.0:
                for g in grads:
                    g.mul_(coef)
        return norm

    # ---- weights out -------------------------------------------------------------------
    def _gathered(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full Megatron tensors under global names, on rank 0 (a collective: the ranks of
        data-parallel shard 0 gather tensor shards; expert ranks gather experts)."""
        stage = self._stage_tensors(dtype)
        if self.pp_size == 1:
            yield from stage
            return
        # Pipeline stages: each stage's leader (tensor, context and data-parallel rank 0) sends its
        # tensors to rank 0, stage after stage. The leaders are rank 0's pipeline group; another
        # rank's pipeline group (another tensor or data-parallel rank) holds no leader but stage 0's.
        leaders = dist.get_process_group_ranks(self.ps.get_pipeline_model_parallel_group())
        leader = self.tp_rank == 0 and self.cp_rank == 0 and self.dp_rank == 0
        if self.rank == 0:
            yield from stage
            for src in leaders[1:]:
                meta: list[Any] = [None]
                dist.recv_object_list(meta, src=src)
                for name, shape, dtype_ in meta[0]:
                    t = torch.empty(shape, dtype=dtype_, device=self.device)
                    dist.recv(t, src=src)
                    yield name, t
        elif leader:
            tensors = list(stage)
            dist.send_object_list([[(n, tuple(t.shape), t.dtype) for n, t in tensors]], dst=0)
            for _, t in tensors:
                dist.send(t.contiguous(), dst=0)
        else:
            for _ in stage:  # help gather this stage's shards
                pass

    def _stage_tensors(self, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        """This stage's full tensors under global names, on its leader (tensor rank 0 of
        data-parallel shard 0; the tied output-layer copy of a last stage left out)."""
        ps = self.ps
        dense_sender = self.dp_rank == 0 and self.cp_rank == 0
        expert_sender = ps.get_expert_data_parallel_rank() == 0 and self.tp_rank == 0
        leader = dense_sender and self.tp_rank == 0
        layers = self.layers
        tied = self._tied_copy()
        for name, p in self.model.named_parameters():
            if tied is p and not self.first_stage or name.startswith("value_head."):
                continue  # the critic's value head has no place in a causal-LM checkpoint
            # float32 out of bfloat16 weights (export): the main weights' own values
            t = (self._main[name] if dtype == torch.float32 and name in self._main else p).detach()
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
            if is_expert(name):
                if not expert_sender:
                    continue
                parts = [t]
                if self.ep_size > 1:
                    parts = [torch.empty_like(t) for _ in range(self.ep_size)]
                    dist.all_gather(parts, t.contiguous(), group=ps.get_expert_model_parallel_group())
                if leader:
                    for r, part in enumerate(parts):
                        yield global_name(name, layers, expert_range(self.layout.num_experts, self.ep_size, r)), part
                continue
            if not dense_sender:
                continue
            if self.tp_size > 1 and tp_dim(name) is not None:
                shards = [torch.empty_like(t) for _ in range(self.tp_size)]
                dist.all_gather(shards, t.contiguous(), group=ps.get_tensor_model_parallel_group())
                t = tp_merge(name, shards)
            if leader:
                yield global_name(name, layers, self.experts), t

    def _full_state(self, dtype: torch.dtype | None = None):
        """(HF name, full tensor, fresh) for every weight, on rank 0 (the others only help gather)."""
        own = {p.data_ptr() for p in self.model.parameters()}
        convert = self.vision.hf_tensors if self.vision else hf_tensors
        for hf_name, t in convert(self._gathered(dtype), self.layout):
            yield hf_name, t, t.data_ptr() not in own

    # ---- weights in (fully async: ActorFwd takes the actor's weights) ------------------
    def _weight_receiver(self) -> MegatronWeightReceiver:
        return MegatronWeightReceiver(self.model, self.layout, self._shard, device=self.device,
                                      timeout_s=self.spec.sync_timeout_s, vision=self.vision)

    def receive_weights(self, path: str, payload: dict) -> dict[str, Any]:
        """The shared protocol (`TrainWorkerBase.receive_weights`); a push's begin drops what an
        unfinished one left, and a CUDA-IPC push's last bucket is checked for incomplete fused
        tensors as a broadcast's is (`weights.py`)."""
        if path == "/begin_weight_update" and self._receiver is not None:
            self._receiver.begin()
        version = payload.get("weight_version") if path == "/update_weights_from_tensor" else None
        if version is None:
            return super().receive_weights(path, payload)
        reply = super().receive_weights(path, {**payload, "weight_version": None})
        if reply["success"]:
            ok, message = self._receiver.finish(int(version), reply["message"])
            reply = {**reply, "success": ok, "message": message}
        return reply

    def shutdown(self) -> None:
        super().shutdown()
        self.ps.destroy_model_parallel()

    # ---- checkpoints -------------------------------------------------------------------
    def _rank_file(self, path: Path) -> Path:
        # Context-parallel ranks hold the same weights; rank 0's file keeps the name the converter reads.
        cp = f"_cp{self.cp_rank}" if self.cp_rank else ""
        return path / "model" / f"tp{self.tp_rank}_pp{self.pp_rank}_ep{self.ep_rank}{cp}_dp{self.dp_rank}.pt"

    def _layout_meta(self) -> dict[str, Any]:
        mp = self.spec.model_parallel
        return {"world_size": self.world_size, "tp": self.tp_size, "pp": self.pp_size, "ep": self.ep_size,
                "cp": self.cp_size, "first_stage_layers": mp.first_stage_layers,
                "last_stage_layers": mp.last_stage_layers}

    def save(self, ckpt_dir: str, rollout_id: int, save_optim: bool = True) -> None:
        """Each rank's own shards (model, optimizer), RNG and the layout; resume needs the same layout
        (a different one: export HF and start from it)."""
        path = Path(ckpt_dir)
        (path / "model").mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {"model": self.model.state_dict(), "main": {n: m.data for n, m in self._main.items()}}
        if save_optim and self.optimizer is not None:
            state["optim"] = self._optimizer_state().state_dict()
        state["rng"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        torch.save(state, self._rank_file(path))
        if self.rank == 0:
            meta = {"rollout_id": rollout_id, "train_step": self.step, "has_optim": "optim" in state,
                    "backend": "megatron", **self._layout_meta(),
                    "scheduler": self.scheduler.state_dict() if self.scheduler else None, "time": time.time()}
            (path / "meta.json").write_text(json.dumps(meta))
        dist.barrier()

    def _read_rank_file(self, path: Path) -> dict[str, Any]:
        meta = json.loads((path / "meta.json").read_text())
        saved = {k: meta.get(k, 1 if k == "cp" else None) for k in self._layout_meta()}
        if meta.get("backend") != "megatron" or saved != self._layout_meta():
            raise ValueError(f"{path} was saved by {meta.get('backend', 'fsdp')} ranks laid out as {saved}; this "
                             f"group is megatron {self._layout_meta()}: resume with the same layout, or start "
                             "from its HF export (--save-hf) with --hf-checkpoint")
        return meta | {"state": torch.load(self._rank_file(path), weights_only=False)}

    def load(self, ckpt_dir: str) -> dict[str, Any]:
        path = Path(ckpt_dir)
        meta = self._read_rank_file(path)
        state = meta.pop("state")
        self.model.load_state_dict(state["model"])
        with torch.no_grad():
            for name, value in state.get("main", {}).items():
                self._main[name].copy_(value)
        if "optim" in state and self.optimizer is not None:
            self._optimizer_state().load_state_dict(state["optim"])
        if self.scheduler is not None and meta.get("scheduler"):
            self.scheduler.load_state_dict(meta["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if state["rng"].get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.step = meta["train_step"]
        return meta

    def load_weights(self, ckpt_dir: str) -> None:
        """Only the model weights (a Reference taking the Actor's, --ref-update-interval): the same
        tensor / pipeline / expert / context layout, any number of data-parallel ranks (every
        data-parallel copy of this rank's shards holds the same weights: the lowest is read)."""
        path = Path(ckpt_dir)
        meta = json.loads((path / "meta.json").read_text())
        mine = {k: v for k, v in self._layout_meta().items() if k != "world_size"}
        saved = {k: meta.get(k, 1 if k == "cp" else None) for k in mine}
        if meta.get("backend") != "megatron" or saved != mine:
            raise ValueError(f"{path} was saved by {meta.get('backend', 'fsdp')} ranks laid out as {saved}; these "
                             f"megatron ranks are {mine}: give them the same model-parallel layout")
        stem = self._rank_file(path).name.rsplit("_dp", 1)[0]
        copies = sorted((path / "model").glob(f"{stem}_dp*.pt"), key=lambda f: int(f.stem.rsplit("_dp", 1)[1]))
        if not copies:
            raise FileNotFoundError(f"{path}/model has no {stem}_dp*.pt: an incomplete checkpoint")
        self.model.load_state_dict(torch.load(copies[0], weights_only=False)["model"])

    def export_hf(self, out_dir: str, tokenizer_path: str) -> None:
        """An HF checkpoint (safetensors under the checkpoint's own names, config, tokenizer)."""
        from safetensors.torch import save_file
        from transformers import AutoTokenizer

        state = {name: t.contiguous().cpu() for name, t, _ in self._full_state(torch.float32)}
        if self.rank == 0:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            if self.vision:  # through the HF model: its save writes the checkpoint's own names and layout
                from relax.distributed.weight_sync import load_hf_named
                from relax.utils.multimodal.processor import copy_processor_files, load_model

                model = load_model(tokenizer_path, config=self.hf_config, from_config=True)
                load_hf_named(model, state)  # experts per expert into transformers' fused ones
                model.tie_weights()
                model.save_pretrained(out, safe_serialization=True)
                copy_processor_files(tokenizer_path, str(out))
            else:
                save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
            self.hf_config.save_pretrained(out)
            AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(out)
            gen = Path(tokenizer_path) / "generation_config.json"
            if gen.exists():
                (out / "generation_config.json").write_text(gen.read_text())
        dist.barrier()


class _MicroBatch:
    """One micro-batch's inputs, and the response head swapped in on the last stage while it runs."""

    def __init__(self, ids_BL, position_BL, causal_11LL, mask_BT, rows, head, entropy, bf16) -> None:
        self.ids_BL, self.position_BL, self.causal_11LL, self.mask_BT = ids_BL, position_BL, causal_11LL, mask_BT
        self.rows, self.head, self.entropy = rows, head, entropy
        self.embed: Any = None  # model -> the decoder's input (a VL micro-batch with media)
        self.autocast = torch.autocast(ids_BL.device.type, dtype=torch.bfloat16, enabled=bf16)

    def __enter__(self) -> "_MicroBatch":
        if self.head is not None:
            self.head.__enter__()
        self.autocast.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.autocast.__exit__(*exc)
        if self.head is not None:
            self.head.__exit__(*exc)

    def call(self, model: torch.nn.Module) -> torch.Tensor:
        if self.embed is not None:
            return model(self.ids_BL, self.position_BL, self.causal_11LL, decoder_input=self.embed(model))
        if hasattr(model, "deepstack_adds"):  # a VL model's micro-batch without media: no deepstack additions
            model.deepstack_adds = None
        return model(self.ids_BL, self.position_BL, self.causal_11LL)

    def outputs(self, out_BTK: torch.Tensor):
        """(logp_BT, mask_BT, entropy_BT or None) of the real rows."""
        out_BTK, mask_BT = out_BTK[:self.rows], self.mask_BT[:self.rows]
        return out_BTK[..., 0].float(), mask_BT, out_BTK[..., 1].float() if self.entropy else None
