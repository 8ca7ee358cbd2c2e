"""The `megatron` training backend's model runner: a megatron-core `GPTModel` on one rank.

The model is built from the HF checkpoint's `config.json` (`model.py`) and its weights converted
from the checkpoint's safetensors (`convert.py`), sharded for this rank's place in the
tensor / pipeline / expert-parallel layout (`--tensor-model-parallel-size`,
`--pipeline-model-parallel-size`, `--expert-model-parallel-size`, `--sequence-parallel`); data
parallelism is what is left of the world (after `--context-parallel-size` too). The rows of a shard
reach every rank of its tensor-parallel group; each computes the same loss from vocabulary-
parallel log-probs (`head.py`); the Trainer (`relax.backends.trainer`) runs the same passes,
losses and optimizer steps as for fsdp. The parts:
    rank.py         the built model, its place in the layout, megatron-core's groups, main weights
    micro_batch.py  a micro-batch's inputs and head (padding to a common shape, context-parallel
                    chunks, media), the one-stage forward
    packing.py      --qkv-format thd: a micro-batch's rows as one packed token stream
    pipeline.py     pipeline parallelism: the micro-batch schedule (megatron-core's 1F1B)
    grads.py        gradient reduction over data/expert/tensor groups and the global norm
    export.py       weights out: shards gathered into full tensors, HF names (push and export)
    checkpoint.py   per-rank checkpoints and the layout they need
    weights.py      weights in (ActorFwd, the Reference): pushed HF tensors into this rank's shards
    routing.py      MoE routing replay: recorded experts replayed by the routers' top-k
    grad_overlap.py --overlap-grad-reduce: gradient buckets all-reduced during the last backward
    param_gather.py --overlap-param-gather: ZeRO-1's weight broadcast waited for by the next forward

On a CPU (gloo, float32) `cpu_shim` covers megatron-core's CUDA-only spots; torch's AdamW is the
optimizer on both (megatron's is CUDA-only), sharded over data-parallel ranks with
--use-distributed-optimizer (the Trainer's ZeRO-1). A "value" head (a critic) is the same model
with a scalar value head in place of the language-model head (`rank.py`). A
vision-language or omni model (Qwen2.5-VL, Qwen3-VL, the Qwen3-Omni thinker): the language model
with M-RoPE, the checkpoint's encoders beside it, whole on every rank (`vision.py`). Not built
yet, and rejected by validation with that message: a value head under pipeline parallelism;
media under pipeline or context parallelism.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from relax.backends.base import LossFn, RankLayout, Rows, TrainerSpec
from relax.backends.megatron import checkpoint, export, grads, pipeline
from relax.backends.megatron.grad_overlap import GradOverlap
from relax.backends.megatron.micro_batch import forward
from relax.backends.megatron.param_gather import ParamGather
from relax.backends.megatron.rank import MegatronRank
from relax.backends.megatron.weights import MegatronWeightReceiver
from relax.backends.trainer.runner_kit import sequential_run

logger = logging.getLogger(__name__)


class MegatronRunner:
    """One megatron rank's model (see the module doc); implements `relax.backends.base.ModelRunner`
    over the built `MegatronRank`."""

    def __init__(self, spec: TrainerSpec, rank: int, world_size: int, device: torch.device) -> None:
        self.spec = spec
        self.r = r = MegatronRank(spec, rank, world_size, device)
        self.model = r.model
        # Expert (tensor) parallelism exchanges tokens inside every forward: the expert group's ranks
        # (each with its own rows) run as many micro-batches. Under context parallelism a rank holds 1/C
        # of a micro-batch's tokens: --max-tokens-per-gpu bounds each rank's share.
        self.layout = RankLayout(
            dp_rank=r.dp_rank, dp_size=r.dp_size, answers=r.tp_rank == 0 and r.cp_rank == 0 and r.last_stage,
            lockstep=r.expert_group, token_scale=r.cp_size)
        self.whole_step = r.pp_size > 1  # a pipeline schedule runs a whole step's micro-batches
        self.grad_overlap = self._grad_overlap()  # --overlap-grad-reduce (grad_overlap.py), or None
        self.param_gather: ParamGather | None = None  # --overlap-param-gather (attach_optimizer)
        self._experts_differ = spec.model_parallel.distributed_optimizer and r.experts_differ_over_dp()
        if self._experts_differ:
            logger.info("--use-distributed-optimizer: this rank's data-parallel peers hold other experts (expert "
                        "(tensor) parallelism); the optimizer state is not sharded")

    def _grad_overlap(self) -> GradOverlap | None:
        """--overlap-grad-reduce: the data-parallel means reduced bucket by bucket during the step's
        last backward; None without the flag or without data-parallel peers (logged)."""
        r = self.r
        if not (self.spec.optim.overlap_grad_reduce and self.spec.trainable):
            return None
        if r.dp_size * r.cp_size == 1:
            logger.info("--overlap-grad-reduce: one data-parallel rank, no gradient to reduce")
            return None
        entries = [(p, r.main.get(name, p)) for name, p in self.model.named_parameters()
                   if p.requires_grad and grads.dense_mean(r, name, p)]
        overlap = GradOverlap(entries, r.ps.get_data_parallel_group(with_context_parallel=True), r.dp_size)
        self.model.config.no_sync_func = overlap.no_sync  # the pipeline schedule's backwards before the last
        return overlap

    # ---- forward and backward ----------------------------------------------------------
    def run(self, micro: list[Rows], loss: LossFn | None, *, entropy: bool = False, entropy_grad: bool = False,
            ends_step: bool = True) -> list[Any]:
        """One stage: micro-batches one by one; pipeline parallelism: megatron-core's schedule."""
        if self.r.pp_size > 1:
            return pipeline.run(self.r, micro, loss, entropy=entropy, entropy_grad=entropy_grad)
        return sequential_run(lambda rows, e, g: forward(self.r, rows, e, g), micro, loss, entropy=entropy,
                              entropy_grad=entropy_grad, ends_step=ends_step, grad_sync=self._grad_sync)

    def _grad_sync(self, last_micro_batch: bool) -> None:
        if self.grad_overlap is not None:  # reduce during the step's last backward only
            self.grad_overlap.arm(last_micro_batch)

    def end_scoring(self, num_rows: int) -> None:
        """Scoring passes are in step already (the expert group's micro-batch counts)."""

    # ---- the optimizer step ----------------------------------------------------------------
    def optimized_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps: the float32 main weights under --bf16, else the model's own."""
        return list(self.r.main.values()) if self.r.main else [p for p in self.model.parameters() if p.requires_grad]

    def optimizer_group(self) -> Any:
        """--use-distributed-optimizer: optimizer state sharded over the data-parallel ranks (not when
        their expert weights differ: ZeRO-1 would broadcast one rank's experts over another's)."""
        if not self.spec.model_parallel.distributed_optimizer or self.r.dp_size == 1 or self._experts_differ:
            return None
        return self.r.ps.get_data_parallel_group()

    def attach_optimizer(self, optimizer: Any) -> None:
        """--overlap-param-gather: ZeRO-1's broadcast of the updated weights is left in flight after
        each step and waited for by the next forward, layer by layer (param_gather.py)."""
        if not self.spec.optim.overlap_param_gather:
            return
        if self.optimizer_group() is None:
            logger.info("--overlap-param-gather: one data-parallel rank (or no --use-distributed-optimizer), no "
                        "parameter broadcast to overlap")
            return
        self.param_gather = ParamGather(optimizer, self.model, self.r.main)

    def _settle(self) -> None:
        """Every weight broadcast of the last step in place, before something reads the weights."""
        if self.param_gather is not None:
            self.param_gather.settle_all()

    def reduce_grads(self) -> None:
        self._settle()  # the next step must not write weights still being broadcast
        grads.reduce(self.r, skip=self.grad_overlap.finish() if self.grad_overlap else frozenset())

    def clip_grad_norm(self, clip: float) -> float:
        return grads.clip_norm(self.r, clip)

    def after_optimizer_step(self) -> None:
        """--bf16: the stepped main weights cast back into the model's bfloat16 weights."""
        if self.r.main and self.param_gather is not None:  # cast as each weight is waited for
            self.param_gather.defer_casts([p for name, p in self.model.named_parameters() if name in self.r.main])
        elif self.r.main:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    if name in self.r.main:
                        p.copy_(self.r.main[name])

    # ---- state -------------------------------------------------------------------------
    def offload_tensors(self) -> Iterator[torch.Tensor]:
        self._settle()
        yield from self.model.parameters()
        yield from self.model.buffers()
        yield from self.r.main.values()  # --bf16: the float32 main weights

    def hf_state(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor, bool]]:
        self._settle()
        return export.hf_state(self.r, dtype)

    def weight_receiver(self) -> MegatronWeightReceiver:
        r = self.r
        return MegatronWeightReceiver(self.model, r.arch, r.shard, device=r.device, timeout_s=self.spec.sync_timeout_s,
                                      vision=r.vision)

    def save_state(self, path: Path, optimizer: Any, save_optim: bool, rng: dict[str, Any]) -> dict[str, Any]:
        self._settle()
        return checkpoint.save(self.r, path, optimizer, save_optim, rng)

    def snapshot_state(self, path: Path, optimizer: Any, save_optim: bool,
                       rng: dict[str, Any]) -> tuple[dict[str, Any], Callable[[], None]]:
        self._settle()
        return checkpoint.snapshot(self.r, path, optimizer, save_optim, rng)

    def load_state(self, path: Path, meta: dict[str, Any], optimizer: Any) -> dict[str, Any]:
        self._settle()
        return checkpoint.load(self.r, path, meta, optimizer)

    def load_weights(self, path: Path) -> None:
        self._settle()
        checkpoint.load_weights(self.r, path)

    def export_hf(self, out_dir: str, tokenizer_path: str) -> None:
        self._settle()
        export.export_hf(self.r, out_dir, tokenizer_path)

    def shutdown(self) -> None:
        self.r.ps.destroy_model_parallel()
