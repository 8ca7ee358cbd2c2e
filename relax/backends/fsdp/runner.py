"""The `fsdp` training backend's model runner: an HF model sharded with FSDP2.

HF `AutoModelForCausalLM` (a VL checkpoint: its image-text-to-text model, vision tower included)
sharded with FSDP2 `fully_shard` per decoder layer (one float32 rank: the plain module, see
`sharded`), its forward through the chunked log-prob head (`head.py`), DCP checkpoints and HF
export (`checkpoint.py`). gloo on CPU, NCCL on GPU, data parallelism only. The passes, losses,
optimizer step and weight protocol are the Trainer's (`relax.backends.trainer`).

With `spec.true_on_policy` every forward (log-prob passes and training) scores its rows one at
a time, unpadded, through `relax.algorithms.logprobs` — the function the `hf` engine reports
its log-probs with under `--rl-on-policy-target fsdp` — so both sides agree bitwise.
A "value" head builds a value model instead: the same causal-LM body with a scalar head
(`AutoModelForTokenClassification`, `num_labels=1`, no dropout; the head is newly initialised
when the checkpoint is a causal LM). Its value for response token t is read at the position
that predicts t, the same position as that token's log-prob.

With `spec.lora` (`--lora-rank`) the model carries LoRA adapters (`relax.backends.lora`), added before
FSDP2 shards it: only they train (the optimizer sees only them), `hf_state` yields only them (the
push), checkpoints hold only them, and the export merges them (docs/lora.md).

Multimodal rows carry their encoder tensors (`pixel_values`, `image_grid_thw`; safetensors bytes
from TransferQueue): a micro-batch's are concatenated and go into the same forward with the
M-RoPE position ids of `relax.utils.multimodal.models.rope_positions`, the positions the
`hf` engine decoded with.

MoE routing replay (docs/moe.md): rows with a routing record (`Rows.routing`) route their tokens to
the recorded experts through hooks on the HF routers (`relax.utils.routing_replay.PaddedRouting`).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from relax.algorithms.logprobs import row_response_logits, token_log_probs
from relax.algorithms.losses import entropy_from_logits
from relax.backends.base import LossFn, RankLayout, Rows, Scores, TrainerSpec
from relax.backends.batching import pad_inputs, response_positions
from relax.backends.fsdp import checkpoint
from relax.backends.fsdp.head import ResponseHead
from relax.backends.lora import adapter_parameters, add_adapters
from relax.backends.trainer.runner_kit import apply_freezing, sequential_run
from relax.utils.multimodal.models import decoder_layers, load_model, rope_positions
from relax.utils.multimodal.tensors import collate, from_bytes
from relax.utils.routing_replay import PaddedRouting

logger = logging.getLogger(__name__)


def sharded(world_size: int, bf16: bool) -> bool:
    """Whether the model is wrapped in FSDP2. One float32 rank has nothing to shard, gather or
    cast: wrapping would only add a gather (a copy) per layer per pass and hooks around every
    layer, so it runs as the plain module (same numbers). With --bf16 one rank stays wrapped:
    FSDP's mixed precision is what computes in bfloat16 over float32 master weights."""
    return world_size > 1 or bf16


class FSDPRunner:
    """One fsdp rank's model (see the module doc); implements `relax.backends.base.ModelRunner`."""

    whole_step = False

    def __init__(self, spec: TrainerSpec, rank: int, world_size: int, device: torch.device) -> None:
        self.spec, self.rank, self.world_size, self.device = spec, rank, world_size, device
        random.seed(spec.optim.seed + rank)
        torch.manual_seed(spec.optim.seed + rank)
        # Every forward all-gathers the sharded weights: all ranks run as many micro-batches (true
        # on-policy runs one forward per row and balances rows instead: `end_scoring`).
        lockstep = dist.group.WORLD if world_size > 1 and not spec.true_on_policy else None
        self.layout = RankLayout(dp_rank=rank, dp_size=world_size, lockstep=lockstep)
        self.model = self._build(spec.model_path)
        self.routing = PaddedRouting(self.model)  # routing replay (MoE, docs/moe.md); a tap on first use
        self._save_group: Any = None  # --async-save: DCP's background writes (`snapshot_state`)

    # ---- setup -------------------------------------------------------------------------
    def _load(self, path: str) -> torch.nn.Module:
        if self.spec.head == "value":
            from transformers import AutoConfig, AutoModelForTokenClassification

            config = AutoConfig.from_pretrained(path, num_labels=1)
            config.classifier_dropout = 0.0  # a value head is a regression: no dropout
            return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
        return load_model(path, dtype=torch.float32)  # a VL checkpoint: its vision tower too

    def _build(self, path: str) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        spec = self.spec
        model = self._load(path).to(self.device)
        self.hf_config = model.config
        self.pad_id = model.config.get_text_config().pad_token_id or 0
        if spec.lora is not None:  # --lora-rank: adapters on the frozen base model (before sharding)
            add_adapters(model, spec.lora)
        if not spec.trainable:
            model.requires_grad_(False)
        if spec.recompute_layers is not None and spec.trainable:
            self._recompute(model, spec.recompute_layers)
        if spec.compile_layers and self.device.type == "cuda":
            for layer in decoder_layers(model):  # before FSDP wraps it, as torchtitan does
                layer.compile(dynamic=True)
        elif spec.compile_layers:
            logger.warning("--use-torch-compile applies to GPU ranks; this rank runs on %s uncompiled", self.device)
        if sharded(self.world_size, spec.optim.bf16):
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if spec.optim.bf16 else None)
            # One rank: keep each layer's gathered (bf16) parameters from forward to backward
            # instead of gathering and casting them again; there is no shard to save memory on.
            reshard = self.world_size > 1
            for layer in decoder_layers(model):
                fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
        if spec.policy:
            apply_freezing(model, spec.optim)
        return model

    @staticmethod
    def _recompute(model: torch.nn.Module, keep: int) -> None:
        """--recompute-*: activation checkpointing of every decoder layer, or the first `keep`."""
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for layer in decoder_layers(model)[keep:] if keep >= 0 else []:
            layer.gradient_checkpointing = False  # --recompute-method block: only the first k

    # ---- forward passes ----------------------------------------------------------------
    def run(self, micro: list[Rows], loss: LossFn | None, *, entropy: bool = False, entropy_grad: bool = False,
            ends_step: bool = True) -> list[Any]:
        forward = self._values if self.spec.head == "value" else self._forward
        return sequential_run(forward, micro, loss, entropy=entropy, entropy_grad=entropy_grad,
                              ends_step=ends_step, grad_sync=self._grad_sync)

    def _grad_sync(self, last_micro_batch: bool) -> None:
        if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP: reduce-scatter on the last micro-batch only
            self.model.set_requires_gradient_sync(last_micro_batch)

    def _media_inputs(self, ids_BL: torch.Tensor, attn_BL: torch.Tensor, media: list[bytes] | None
                      ) -> dict[str, torch.Tensor]:
        """Forward kwargs of a multimodal micro-batch: every row's encoder tensors, concatenated,
        and the M-RoPE position ids (`relax.utils.multimodal.models.rope_positions`); {} for text rows."""
        rows = [from_bytes(m) for m in media or []]
        if not any(rows):
            return {}
        tensors = {k: v.to(self.device) for k, v in collate(rows).items()}
        return {**tensors, "position_ids": rope_positions(self.model, ids_BL, attn_BL, tensors)}

    def _forward(self, rows: Rows, entropy: bool = False, entropy_grad: bool = False) -> Scores:
        """Response-aligned log-probs, mask (and entropies) at the rollout temperature.

        The model's output layer is swapped for the chunked log-prob head for this forward
        (`ResponseHead`): no [B, L, V] logits are built, only the response tokens' log-probs
        (and entropies, detached unless `entropy_grad`). The forward still goes through the
        model's own `__call__`, so FSDP's hooks see the outputs and inputs they expect."""
        if self.spec.true_on_policy:
            return self._forward_rows(rows, entropy)
        tokens = rows.tokens
        ids_BL, attn_BL = pad_inputs(tokens, self.pad_id)
        ids_BL, attn_BL = ids_BL.to(self.device), attn_BL.to(self.device)
        extra = self._media_inputs(ids_BL, attn_BL, rows.media)
        index_BT, mask_BT = response_positions([len(t) for t in tokens], rows.response_lengths)
        # Padded positions of short responses may point past the row; clamp, the mask zeroes them.
        index_BT = index_BT.clamp(max=ids_BL.shape[1] - 2).to(self.device)
        mask_BT = mask_BT.to(self.device)
        targets_BT = ids_BL[:, 1:].gather(1, index_BT)
        head = ResponseHead(self.model.get_output_embeddings(), index_BT, mask_BT, targets_BT,
                            temperature=self.spec.temperature, chunk=self.spec.batch.log_probs_chunk_size,
                            entropy=entropy, entropy_grad=entropy_grad,
                            fused=self.spec.compile_layers and self.device.type == "cuda")
        # Routing replay (MoE): the rows' recorded experts replayed, the routing used kept when asked
        self.routing.arm(rows.routing, rows.record_routing, ids_BL.shape[1], self.device)
        with head:
            out_BTK = self.model(input_ids=ids_BL, attention_mask=attn_BL, use_cache=False, **extra).logits
        routing = self.routing.recorded([len(t) for t in tokens]) if rows.record_routing else None
        return Scores(out_BTK[..., 0], mask_BT, out_BTK[..., 1] if entropy else None, routing=routing)

    def _forward_rows(self, rows: Rows, entropy: bool) -> Scores:
        """`_forward` for true on-policy: one unpadded forward per row (the engine's computation),
        right-padded afterwards to `[B, T]` (padding after the fact changes no value)."""
        lengths = rows.response_lengths
        width = max(max(lengths), 1)
        logps, ents = [], []
        for r, (toks, n) in enumerate(zip(rows.tokens, lengths)):
            ids_1L = torch.tensor([toks], dtype=torch.long, device=self.device)
            media = None if rows.media is None else [rows.media[r]]
            extra = self._media_inputs(ids_1L, torch.ones_like(ids_1L), media)
            logits_RV = row_response_logits(self.model, toks, n, self.spec.temperature, self.device, extra)
            logps.append(torch.nn.functional.pad(token_log_probs(logits_RV, toks[len(toks) - n:]), (0, width - n)))
            if entropy:
                ents.append(torch.nn.functional.pad(entropy_from_logits(logits_RV), (0, width - n)))
        _, mask_BT = response_positions([len(t) for t in rows.tokens], lengths)
        return Scores(torch.stack(logps), mask_BT.to(self.device), torch.stack(ents) if entropy else None)

    def end_scoring(self, num_rows: int) -> None:
        """True on-policy, several ranks: every FSDP forward is a collective (parameter
        all-gathers), so a rank with fewer rows runs throwaway one-token forwards until all ranks
        have run as many as the busiest one."""
        if not self.spec.true_on_policy or self.world_size == 1:
            return
        most = torch.tensor([num_rows], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        for _ in range(int(most) - num_rows):
            self.model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device), use_cache=False)

    def _values(self, rows: Rows, entropy: bool = False, entropy_grad: bool = False) -> Scores:
        """A value head's response-aligned values (of the state each token is chosen in) and mask."""
        ids_BL, attn_BL = pad_inputs(rows.tokens, self.pad_id)
        values_BL = self.model(input_ids=ids_BL.to(self.device), attention_mask=attn_BL.to(self.device),
                               use_cache=False).logits[..., 0].float()
        index_BT, mask_BT = response_positions([len(t) for t in rows.tokens], rows.response_lengths)
        index_BT = index_BT.clamp(max=values_BL.shape[1] - 1).to(self.device)
        mask_BT = mask_BT.to(self.device)
        return Scores(values_BL.gather(1, index_BT) * mask_BT, mask_BT)

    # ---- the optimizer step ----------------------------------------------------------------
    def optimized_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def optimizer_group(self) -> Any:
        return None

    def attach_optimizer(self, optimizer: Any) -> None:
        """Nothing to attach: FSDP2 gathers and reduces in its own hooks (--overlap-* are plan notes)."""

    def reduce_grads(self) -> None:
        """FSDP reduce-scatters gradients inside the step's last backward."""

    def clip_grad_norm(self, clip: float) -> float:
        """Clip to `clip` (0: no clipping) and return the global gradient norm."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        return float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)

    def after_optimizer_step(self) -> None:
        """The optimizer stepped the model's own (sharded) parameters."""

    # ---- state -------------------------------------------------------------------------
    def offload_tensors(self) -> Iterator[torch.Tensor]:
        for t in (*self.model.parameters(), *self.model.buffers()):
            yield t.to_local() if hasattr(t, "to_local") else t  # FSDP2: this rank's shard

    def hf_state(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor, bool]]:
        """(name, full tensor, fresh) for every parameter (with --lora-rank: every adapter tensor, all
        that changes); a collective, so every rank iterates. `dtype`: floating tensors are cast first
        (a sharded one before its gather: half the bytes for bf16); `fresh` says the tensor is a copy,
        not the parameter's own memory."""
        params = adapter_parameters(self.model) if self.spec.lora else self.model.named_parameters()
        for name, p in params:
            t = p.detach()
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                t = t.to(dtype)
            full = t.full_tensor() if hasattr(t, "full_tensor") else t
            own = p.to_local() if hasattr(p, "to_local") else p
            yield name, full, full.data_ptr() != own.data_ptr()

    def weight_receiver(self) -> Any:
        """Pushed HF tensors into this rank's (FSDP-sharded) parameters."""
        from relax.backends.fsdp.weights import ShardedWeightReceiver

        return ShardedWeightReceiver(self.model, device=self.device, timeout_s=self.spec.sync_timeout_s)

    def save_state(self, path: Path, optimizer: Any, save_optim: bool, rng: dict[str, Any]) -> dict[str, Any]:
        return checkpoint.save(self, path, optimizer, save_optim, rng)

    def snapshot_state(self, path: Path, optimizer: Any, save_optim: bool,
                       rng: dict[str, Any]) -> tuple[dict[str, Any], Callable[[], None]]:
        if self._save_group is None:  # the background write's collectives: a group apart from training's
            self._save_group = dist.new_group(backend="gloo")
        return checkpoint.snapshot(self, path, optimizer, save_optim, rng, self._save_group)

    def load_state(self, path: Path, meta: dict[str, Any], optimizer: Any) -> dict[str, Any]:
        return checkpoint.load(self, path, meta, optimizer)

    def load_weights(self, path: Path) -> None:
        checkpoint.load_weights(self.model, path, adapters_only=self.spec.lora is not None)

    def export_hf(self, out_dir: str, tokenizer_path: str) -> None:
        checkpoint.export_hf(self, out_dir, tokenizer_path)

    def shutdown(self) -> None:
        """Nothing beyond the process group (the Trainer destroys it)."""
