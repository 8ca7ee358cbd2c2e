"""The small interfaces the components and the trainer program against; each backend implements them.

Training: one `relax.backends.trainer.Trainer` per rank (a Ray actor constructed as
`Trainer(rank, world_size, master_addr, master_port, spec: TrainerSpec)`) holds the
backend's `ModelRunner`, which builds and runs the model; the Trainer does the rest
(micro-batch plans, losses, optimizer steps, weight push, checkpoints). What the model is comes
from the spec as data (`head`, `trainable`), never from the name of the role that asked for it.

Inference: a launch function per backend returning an `EngineHandle` that serves SGLang's HTTP
protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Protocol

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.config.lora import LoraSpec
from relax.config.observability import TrainProfileConfig
from relax.config.schema import BatchConfig, OptimizerConfig

if TYPE_CHECKING:
    import torch


@dataclass
class ModelParallelSpec:
    """The megatron backend's model-parallel layout and model flags (ignored by fsdp, which
    validation keeps from being given them)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    distributed_optimizer: bool = False  # --use-distributed-optimizer: optimizer state sharded over data-parallel ranks
    etp: int = 1  # --expert-tensor-parallel-size: each expert's weights split over this many ranks
    qkv_format: str = "thd"  # micro-batches: "thd" packed rows, "bshd" padded (checks.megatron.qkv_layout)
    allgather_cp: bool = False  # --allgather-cp: each row's C contiguous chunks, not the load-balanced 2C
    recompute_loss_function: bool = False  # --recompute-loss-function: the vocab-parallel head recomputed in backward
    model_name: str | None = None  # --model-name: the conversion family (None: the checkpoint's model_type)
    model_provider: str | None = None  # --custom-model-provider-path
    # The seed's model flags (--num-layers, --hidden-size, ...) as given: checked against config.json.
    arch_flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainerSpec:
    """What one rank needs: its own config, not the whole run's."""

    model_path: str
    backend: str = "fsdp"  # a name of relax.backends.registry.TRAIN_BACKENDS
    # What the model computes: "lm" response log-probs (a policy, a reference, a teacher),
    # "value" per-token values (a critic: the causal-LM body with a scalar head).
    head: Literal["lm", "value"] = "lm"
    trainable: bool = True  # False: forward only (weights frozen, no optimizer)
    name: str = "trainer"  # the worker group's name, for messages
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    loss: PolicyLossConfig | None = None
    temperature: float = 1.0
    total_steps: int = 1
    threads: int = 0
    # --true-on-policy-mode: score every row alone through relax.algorithms.logprobs (as the
    # engine does), so trainer log-probs equal the engine's bitwise (docs/true-on-policy.md).
    true_on_policy: bool = False
    # --recompute-*: decoder layers whose activations are recomputed in backward (None: none;
    # -1: all; k: the first k).
    recompute_layers: int | None = None
    compile_layers: bool = False  # --use-torch-compile: torch.compile each decoder layer (GPU only)
    # The step is one on-policy pass (relax.config.plan.reuses_training_log_probs): a batch
    # without old log-probs takes the training forward's own, detached.
    old_logp_from_training: bool = False
    timeout_minutes: int = 10
    dist_backend: str = "nccl"  # --distributed-backend of the training ranks on GPUs (gloo on CPU)
    bucket_bytes: int = 512 << 20
    sync_timeout_s: float = 120.0
    weight_sync_backend: str = "nccl"  # --checkpoint-engine-backend; CPU ranks always use gloo
    # The dtype weights travel in (None: the parameters' own, float32). bf16 training pushes bf16:
    # half the bytes, and every receiver computes with exactly those values (engines hold bf16,
    # a bf16 ActorFwd casts its float32 copy back to the same bf16).
    push_dtype: str | None = None
    value_clip: float = 0.2  # --value-clip (value head only)
    # Dotted paths of loss plugins, loaded in each rank (see docs/algorithms.md "Plugins").
    custom_loss_path: str | None = None
    pg_loss_reducer_path: str | None = None
    tis_path: str | None = None
    model_parallel: ModelParallelSpec = field(default_factory=ModelParallelSpec)
    # --use-routing-replay (implied by --use-rollout-routing-replay): an MoE "lm" model's forwards
    # replay recorded routing (`relax.backends.trainer.routing`; docs/moe.md).
    routing_replay: bool = False
    # --lora-rank > 0: the model carries LoRA adapters (`relax.backends.lora`); only they train, are
    # checkpointed and pushed (a frozen scorer with it takes the actor's pushed adapters).
    lora: LoraSpec | None = None
    # Where rank 0 writes each pushed adapter as peft files for engines that load adapters from disk
    # (SGLang's /load_lora_adapter, `relax.distributed.weights.adapter_files`); None: adapter tensors
    # travel by broadcast like any weights (the hf engine, training ranks).
    adapter_dir: str | None = None
    # --use-pytorch-profiler, --record-memory-history, --enable-cuda-memory-check and their options
    # (`relax.backends.trainer.profiling`); `trace_dir`: where the traces go (None: no profiler).
    profile: TrainProfileConfig = field(default_factory=TrainProfileConfig)
    trace_dir: str | None = None
    # --keep-old-actor: weight versions kept on the host to score old log-probs with (0: none;
    # `relax.backends.trainer.kept_weights`). --disable-weights-backuper: the colocate offload frees
    # its host buffers after each onload. --train-memory-margin-bytes on a GPU shared with the engines
    # (0: none; `memory_margin`). --check-weight-update-equal: each push is checked on the engines.
    keep_weights: int = 0
    keep_host_buffers: bool = True
    memory_margin_bytes: int = 0
    check_weights: bool = False

    @property
    def policy(self) -> bool:
        """A trained language-model head: the policy (its parameter freezing flags apply)."""
        return self.head == "lm" and self.trainable


@dataclass(frozen=True)
class RankLayout:
    """Where a rank's rows come from and what it answers for: every rank of one data-parallel
    shard (a model-parallel group) receives the same rows, one of them (`answers`) returns the
    results. `lockstep`: the process group whose ranks must run as many micro-batches because
    their forwards communicate (None: forwards are local). `token_scale`: how many ranks'
    `--max-tokens-per-gpu` one micro-batch may hold (context parallelism splits each row)."""

    dp_rank: int = 0
    dp_size: int = 1
    answers: bool = True
    lockstep: Any = None
    token_scale: int = 1


@dataclass
class Rows:
    """One micro-batch as a runner takes it: prompt + response ids per row, response lengths,
    and (a multimodal run) each row's encoder tensors as the data plane's bytes."""

    tokens: list[list[int]]
    response_lengths: list[int]
    media: list[bytes] | None = None
    # Routing replay (MoE, `relax.backends.trainer.routing`): per row the expert ids to replay,
    # [positions, layers, top_k] from position 0 (None: the row routes freely), and whether the
    # forward returns the routing it used (`Scores.routing`). A dense model's rows carry neither.
    routing: list[Any] | None = None
    record_routing: bool = False


@dataclass
class Scores:
    """A forward's response-aligned outputs `[B, T]`: log-probs (an "lm" head) or values (a
    "value" head), the mask of real response tokens, and entropies when asked for."""

    values_BT: torch.Tensor
    mask_BT: torch.Tensor
    entropy_BT: torch.Tensor | None = None
    routing: list[Any] | None = None  # per row [len - 1, layers, top_k] when the rows asked (record_routing)


# The loss of micro-batch k of a schedule from its forward's scores; its `.loss` goes backward.
LossFn = Callable[[int, Scores], Any]


class ModelRunner(Protocol):
    """One rank's model in a training backend: built from `TrainerSpec` by the backend's
    runner class (`cls(spec, rank, world_size, device)`, after the world's process group is up).
    The Trainer owns the optimizer, the passes, the losses and the weight protocol; the runner
    owns what depends on how the model is built, sharded and run."""

    model: torch.nn.Module
    layout: RankLayout
    # The schedule needs every micro-batch of an optimizer step at once (a pipeline schedule);
    # False: micro-batches run one by one as their rows arrive.
    whole_step: bool

    # ---- forward and backward
    def run(self, micro: list[Rows], loss: LossFn | None, *, entropy: bool = False,
            entropy_grad: bool = False, ends_step: bool = True) -> list[Any]:
        """Forward `micro` in order; with `loss`, back-propagate each micro-batch's loss (gradients
        are reduced over data-parallel ranks in the backward of the step's last one when
        `ends_step`, if the backend reduces in backward). Returns the loss outputs, or without
        `loss` the `Scores` of each micro-batch (on the answering ranks; others may return [])."""
        ...

    def end_scoring(self, num_rows: int) -> None:
        """After a scoring pass of `num_rows` rows (ranks whose per-row forwards are collectives
        make up for peers with more rows)."""
        ...

    # ---- the optimizer step
    def optimized_parameters(self) -> list[torch.nn.Parameter]: ...
    def optimizer_group(self) -> Any:
        """The data-parallel group to shard optimizer state over (ZeRO-1), or None."""
        ...
    def attach_optimizer(self, optimizer: Any) -> None:
        """The optimizer the Trainer built over `optimized_parameters()` (megatron: --overlap-param-gather
        leaves ZeRO-1's weight broadcast in flight for the next forward to wait for)."""
        ...
    def reduce_grads(self) -> None: ...
    def clip_grad_norm(self, clip: float) -> float: ...
    def after_optimizer_step(self) -> None: ...

    # ---- state
    def offload_tensors(self) -> Iterator[torch.Tensor]:
        """What a colocate offload moves to the host besides the optimizer state: the model's
        weights and buffers (local shards) and any copy of them the runner keeps."""
        ...
    def hf_state(self, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor, bool]]:
        """(HF name, full tensor, fresh) of every weight, on rank 0 (a collective: every rank
        iterates); `fresh`: the tensor is a copy, not the parameter's own memory."""
        ...
    def weight_receiver(self) -> Any:
        """A `WeightReceiver` loading pushed HF-named tensors into this rank's model."""
        ...
    def save_state(self, path: Path, optimizer: Any, save_optim: bool, rng: dict[str, Any]) -> dict[str, Any]:
        """Write this rank's model (and optimizer) state and RNG under checkpoint `path`; returns
        what rank 0 adds to meta.json."""
        ...
    def snapshot_state(self, path: Path, optimizer: Any, save_optim: bool,
                       rng: dict[str, Any]) -> tuple[dict[str, Any], Callable[[], None]]:
        """--async-save: copy what `save_state` writes to the host now; returns (what rank 0 adds to
        meta.json, the write of that copy under `path`, which a background thread runs)."""
        ...
    def load_state(self, path: Path, meta: dict[str, Any], optimizer: Any) -> dict[str, Any]:
        """Load what `save_state` wrote; returns the RNG state to restore."""
        ...
    def load_weights(self, path: Path) -> None: ...
    def export_hf(self, out_dir: str, tokenizer_path: str) -> None: ...
    def shutdown(self) -> None: ...


class EngineHandle(Protocol):
    """A running inference engine process speaking SGLang's native HTTP API at `url`."""

    url: str

    def wait_ready(self, timeout: float) -> None: ...
    def alive(self) -> bool: ...
    def describe(self) -> str: ...  # pid, url, exited (code) / stopped / silent, log path and tail
    def terminate(self, timeout: float = 10.0) -> None: ...
