"""One data-parallel rank of the `fsdp` training backend (a Ray actor process).

HF `AutoModelForCausalLM` (a VL checkpoint: its image-text-to-text model, vision tower included)
sharded with FSDP2 `fully_shard` per decoder layer (one float32 rank: the plain module, see
`sharded`), its forward through the chunked log-prob head, DCP
checkpoints and HF export. gloo on CPU, NCCL on GPU. Micro-batching, the training pass, the
losses, the optimizer step and the weight push are the backend-agnostic half
(`relax.backends.train_worker.TrainWorkerBase`).

With `spec.true_on_policy` every forward (log-prob passes and training) scores its rows one at
a time, unpadded, through `relax.algorithms.logprobs` — the function the `hf` engine reports
its log-probs with under `--rl-on-policy-target fsdp` — so both sides agree bitwise.
Role "critic" builds a value model instead: the same causal-LM body with a scalar head
(`AutoModelForTokenClassification`, `num_labels=1`, no dropout; the head is newly initialised
when the checkpoint is a causal LM). Its value for response token t is read at the position
that predicts t, the same position as that token's log-prob, and it trains on
`relax.algorithms.value_loss`.

Multimodal rows carry their encoder tensors (`pixel_values`, `image_grid_thw`; safetensors bytes
from TransferQueue): a micro-batch's are concatenated and go into the same forward with the
M-RoPE position ids of `relax.utils.multimodal.processor.rope_positions`, the positions the
`hf` engine decoded with.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from relax.algorithms.chunked_logprobs import chunked_token_log_probs
from relax.algorithms.logprobs import row_response_logits, token_log_probs
from relax.algorithms.losses import entropy_from_logits
from relax.backends.batching import pad_inputs, response_positions
from relax.backends.train_worker import TRAINABLE_ROLES, TrainWorkerBase
from relax.utils.multimodal.processor import (collate, copy_processor_files, decoder_layers, from_bytes,
                                              is_multimodal, load_model, rope_positions)

logger = logging.getLogger(__name__)


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


class FSDPTrainWorker(TrainWorkerBase):
    """HF model, FSDP2 over every rank (data parallelism only)."""

    # ---- setup -------------------------------------------------------------------------
    def _build_model(self, path: str) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoConfig, AutoModelForTokenClassification

        dtype = torch.float32
        if self.spec.role == "critic":
            config = AutoConfig.from_pretrained(path, num_labels=1)
            config.classifier_dropout = 0.0  # a value head is a regression: no dropout
            model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype)
        else:
            model = load_model(path, dtype=dtype)  # a VL checkpoint: its vision tower too
        model = model.to(self.device)
        self.hf_config = model.config
        self.pad_id = model.config.get_text_config().pad_token_id or 0
        if self.spec.role not in TRAINABLE_ROLES:
            model.requires_grad_(False)
        if self.spec.recompute_layers is not None and self.spec.role in TRAINABLE_ROLES:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2's name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            keep = self.spec.recompute_layers
            for layer in decoder_layers(model)[keep:] if keep >= 0 else []:
                layer.gradient_checkpointing = False  # --recompute-method block: only the first k
        if self.spec.compile_layers and self.device.type == "cuda":
            for layer in decoder_layers(model):  # before FSDP wraps it, as torchtitan does
                layer.compile(dynamic=True)
        elif self.spec.compile_layers:
            logger.warning("--use-torch-compile applies to GPU ranks; this rank runs on %s uncompiled", self.device)
        if sharded(self.world_size, self.spec.optim.bf16):
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if self.spec.optim.bf16 else None)
            # One rank: keep each layer's gathered (bf16) parameters from forward to backward
            # instead of gathering and casting them again; there is no shard to save memory on.
            reshard = self.world_size > 1
            for layer in decoder_layers(model):
                fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
        self._apply_freezing(model)
        return model

    # ---- forward passes ----------------------------------------------------------------
    def _media_inputs(self, ids_BL: torch.Tensor, attn_BL: torch.Tensor, media: list[bytes] | None
                      ) -> dict[str, torch.Tensor]:
        """Forward kwargs of a multimodal micro-batch: every row's encoder tensors, concatenated,
        and the M-RoPE position ids (`relax.utils.multimodal.processor`); {} for text rows."""
        rows = [from_bytes(m) for m in media or []]
        if not any(rows):
            return {}
        tensors = {k: v.to(self.device) for k, v in collate(rows).items()}
        return {**tensors, "position_ids": rope_positions(self.model, ids_BL, attn_BL, tensors)}

    def _forward(self, tokens: list[list[int]], response_lengths: list[int], *, entropy: bool = False,
                 entropy_grad: bool = False, media: list[bytes] | None = None):
        """Response-aligned `logp_BT`, `mask_BT` (and `entropy_BT`) at the rollout temperature.
        `media`: the rows' encoder tensors (a multimodal run; safetensors bytes per row).

        The model's output layer is swapped for the chunked log-prob head for this forward
        (`ResponseHead`): no [B, L, V] logits are built, only the response tokens' log-probs
        (and entropies, detached unless `entropy_grad`). The forward still goes through the
        model's own `__call__`, so FSDP's hooks see the outputs and inputs they expect."""
        if self.spec.true_on_policy:
            return self._forward_rows(tokens, response_lengths, entropy=entropy, media=media)
        ids_BL, attn_BL = pad_inputs(tokens, self.pad_id)
        ids_BL, attn_BL = ids_BL.to(self.device), attn_BL.to(self.device)
        extra = self._media_inputs(ids_BL, attn_BL, media)
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
            out_BTK = self.model(input_ids=ids_BL, attention_mask=attn_BL, use_cache=False, **extra).logits
        return out_BTK[..., 0], mask_BT, out_BTK[..., 1] if entropy else None

    def _forward_rows(self, tokens: list[list[int]], response_lengths: list[int], *, entropy: bool = False,
                      media: list[bytes] | None = None):
        """`_forward` for true on-policy: one unpadded forward per row (the engine's computation),
        right-padded afterwards to `[B, T]` (padding after the fact changes no value)."""
        width = max(max(response_lengths), 1)
        logps, ents = [], []
        for r, (toks, n) in enumerate(zip(tokens, response_lengths)):
            ids_1L = torch.tensor([toks], dtype=torch.long, device=self.device)
            extra = self._media_inputs(ids_1L, torch.ones_like(ids_1L), None if media is None else [media[r]])
            logits_RV = row_response_logits(self.model, toks, n, self.spec.temperature, self.device, extra)
            logps.append(torch.nn.functional.pad(token_log_probs(logits_RV, toks[len(toks) - n:]), (0, width - n)))
            if entropy:
                ents.append(torch.nn.functional.pad(entropy_from_logits(logits_RV), (0, width - n)))
        _, mask_BT = response_positions([len(t) for t in tokens], response_lengths)
        return torch.stack(logps), mask_BT.to(self.device), torch.stack(ents) if entropy else None

    def _lockstep_group(self):
        """Every forward all-gathers the sharded weights: all ranks run as many micro-batches
        (true on-policy runs one forward per row and balances rows instead)."""
        return dist.group.WORLD if self.world_size > 1 and not self.spec.true_on_policy else None

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

    # ---- weights out -------------------------------------------------------------------
    def _set_grad_sync(self, last_micro_batch: bool) -> None:
        if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP: reduce-scatter on the last micro-batch only
            self.model.set_requires_gradient_sync(last_micro_batch)

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

    # ---- weights in (fully async: ActorFwd takes the actor's weights) ------------------
    def _weight_receiver(self) -> Any:
        """Pushed HF tensors into this rank's (FSDP-sharded) parameters."""
        from relax.backends.fsdp.weights import ShardedWeightReceiver

        return ShardedWeightReceiver(self.model, device=self.device, timeout_s=self.spec.sync_timeout_s)

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
        """Write an HF checkpoint loadable by `AutoModelForCausalLM.from_pretrained` (a VL model's by
        `AutoModelForImageTextToText`, with its image processor)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from transformers import AutoTokenizer

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            model = load_model(tokenizer_path, config=self.hf_config, from_config=True)
            model.load_state_dict(full, strict=False)
            model.tie_weights()
            model.save_pretrained(out_dir, safe_serialization=True)
            AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(out_dir)
            if is_multimodal(self.hf_config):  # its image / video processor, feature extractor
                copy_processor_files(tokenizer_path, out_dir)
        dist.barrier()

