"""The small interfaces the components program against; each backend implements them.

Training backends are Ray actor classes constructed as `cls(rank, world_size, master_addr,
master_port, spec: TrainerSpec)`; inference backends are launch functions returning an
`EngineHandle` that serves SGLang's HTTP protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.types import TrainBatch


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
    # The seed's model flags (--num-layers, --hidden-size, ...) as given: checked against config.json.
    arch_flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainerSpec:
    """What one rank needs: its own config, not the whole run's."""

    model_path: str
    role: str = "actor"  # "actor" trains the policy, "critic" a value model; "reference" only scores
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
    value_clip: float = 0.2  # --value-clip (critic only)
    # Dotted paths of loss plugins, loaded in each rank (see docs/algorithms.md "Plugins").
    custom_loss_path: str | None = None
    pg_loss_reducer_path: str | None = None
    tis_path: str | None = None
    model_parallel: ModelParallelSpec = field(default_factory=ModelParallelSpec)


class TrainWorker(Protocol):
    """One data-parallel rank. Training data is a `relax.types.TrainBatch` (per-row lists)."""

    def compute_log_probs(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]: ...
    def compute_values(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]: ...  # critic
    def train(self, batch: TrainBatch, num_steps: int, global_tokens_per_step: list[int]) -> dict[str, float]: ...
    # The streaming loader: plan a pass from the rows' lengths, feed rows as they are scored
    # (micro-batches run in plan order once their rows are in), finish; `train` is the three.
    def train_begin(self, lengths: list[int], num_steps: int, global_tokens_per_step: list[int]) -> None: ...
    def train_rows(self, positions: list[int], rows: TrainBatch) -> int: ...
    def train_end(self) -> dict[str, float]: ...
    # Rank 0 joins the receivers' weight-update group and returns its backend (nccl / gloo).
    def connect_engines(self, engine_urls: list[str], api_key: str | None) -> str | None: ...
    def connect_receivers(self, endpoints: list[Any], api_key: str | None, pause_mode: str) -> str | None: ...
    def push_weights(self, version: int) -> dict[str, float]: ...
    def save(self, ckpt_dir: str, rollout_id: int, save_optim: bool = True) -> None: ...
    def load(self, ckpt_dir: str) -> dict[str, Any]: ...
    def load_weights(self, ckpt_dir: str) -> None: ...  # model weights only (reference refresh)
    def export_hf(self, out_dir: str, tokenizer_path: str) -> None: ...
    def shutdown(self) -> None: ...


class EngineHandle(Protocol):
    """A running inference engine process speaking SGLang's native HTTP API at `url`."""

    url: str

    def wait_ready(self, timeout: float) -> None: ...
    def alive(self) -> bool: ...
    def describe(self) -> str: ...  # pid, url, exited (code) / stopped / silent, log path and tail
    def terminate(self, timeout: float = 10.0) -> None: ...
