"""One megatron rank's model and its place in the parallel layout: what the megatron runner's
parts (`micro_batch.py`, `pipeline.py`, `grads.py`, `export.py`, `checkpoint.py`) work on.

`MegatronRank` initialises megatron-core's model-parallel groups for this rank
(`--tensor/pipeline/context/expert-model-parallel-size`, `--expert-tensor-parallel-size`, data
parallelism the rest), seeds it, builds the `GPTModel` of its pipeline stage from the HF
checkpoint's config (`model.py`; or --custom-model-provider-path's model), loads its shards of the
converted weights (`convert.py`, the family --model-name names), adds a VL model's encoders
(`vision.py`) or a critic's value head, and under --bf16 keeps float32 main weights beside the
bfloat16 model. `packed`: its micro-batches pack their rows (--qkv-format thd, `packing.py`).
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import torch
import torch.distributed as dist

from relax.backends.base import TrainerSpec
from relax.backends.megatron import compile_shim, cpu_shim
from relax.backends.megatron.attention import cp_positions, install_cp_rope
from relax.backends.megatron.convert import Layout, expert_range, hf_to_megatron, shard_state, stage_layers
from relax.backends.megatron.model import (
    build_gpt, check_arch_flags, provided_model, read_hf_state, rope_theta, transformer_config,
)
from relax.backends.megatron.routing import MegatronRouting
from relax.backends.megatron.vision import TOWER_PREFIXES, VisionSide, check_supported, split_state
from relax.backends.trainer.runner_kit import apply_freezing


class MegatronRank:
    """This rank's built model, its layout and the megatron-core groups it is part of."""

    def __init__(self, spec: TrainerSpec, rank: int, world_size: int, device: torch.device) -> None:
        self.spec, self.rank, self.world_size, self.device = spec, rank, world_size, device
        self._setup_parallel()
        random.seed(spec.optim.seed + rank)
        # Every rank of a tensor-parallel group draws the same numbers (it computes the same rows).
        cpu_shim.seed_model_parallel(spec.optim.seed + self.dp_rank)
        self.pad_to = (0, 0)  # (rows, length) every micro-batch is padded to (a pipeline schedule's)
        self.model = self._build(spec.model_path)
        # Routing replay (MoE, routing.py): the routers' top-k replayable; None for a dense model
        self.routing = MegatronRouting(self) if spec.routing_replay and spec.head == "lm" and \
            self.arch.num_experts else None
        # --qkv-format thd packs rows where this build packs them (packing.py; the plan notes the rest:
        # relax.config.checks.megatron.qkv_layout)
        mp = spec.model_parallel
        self.packed = mp.qkv_format == "thd" and mp.pp == 1 and mp.cp == 1 and self.vision is None and \
            self.routing is None

    # ---- setup -------------------------------------------------------------------------
    def _setup_parallel(self) -> None:
        from megatron.core import parallel_state as ps

        cpu_shim.apply()
        mp = self.spec.model_parallel
        if mp.cp > 1 and mp.pp > 1:
            raise NotImplementedError(
                f"--context-parallel-size {mp.cp} with --pipeline-model-parallel-size {mp.pp}: the megatron backend "
                "does not run context and pipeline parallelism together yet; set one of them to 1")
        if self.world_size % (mp.tp * mp.pp * mp.cp) or self.world_size % (mp.etp * mp.ep * mp.pp):
            raise ValueError(f"{self.world_size} ranks do not split into tensor x pipeline x context parallel "
                             f"groups of {mp.tp} x {mp.pp} x {mp.cp} and expert tensor x expert groups of "
                             f"{mp.etp} x {mp.ep} per stage")
        ps.initialize_model_parallel(tensor_model_parallel_size=mp.tp, pipeline_model_parallel_size=mp.pp,
                                     context_parallel_size=mp.cp, expert_model_parallel_size=mp.ep,
                                     expert_tensor_parallel_size=mp.etp)
        self.ps = ps
        self.etp_rank, self.etp_size = ps.get_expert_tensor_parallel_rank(), mp.etp
        # The ranks whose MoE forwards exchange tokens (the all-gather dispatcher's expert tensor x
        # expert group): they run as many micro-batches, of one token count; None: no exchange.
        self.expert_group = ps.get_expert_tensor_and_model_parallel_group() if mp.etp * mp.ep > 1 else None
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.tp_rank, self.tp_size = ps.get_tensor_model_parallel_rank(), mp.tp
        self.ep_rank, self.ep_size = ps.get_expert_model_parallel_rank(), mp.ep
        self.pp_rank, self.pp_size = ps.get_pipeline_model_parallel_rank(), mp.pp
        self.cp_rank, self.cp_size = ps.get_context_parallel_rank(), mp.cp
        self.first_stage, self.last_stage = self.pp_rank == 0, self.pp_rank == mp.pp - 1

    def _check(self, path: str, text_config: Any) -> None:
        mp, arch = self.spec.model_parallel, self.arch
        check_arch_flags(mp.arch_flags, arch, text_config, path)
        if arch.num_experts and mp.tp > 1 and not mp.sequence_parallel:
            raise ValueError("an MoE model with --tensor-model-parallel-size > 1 needs --sequence-parallel "
                             "(megatron-core's rule)")
        if mp.ep * mp.etp > 1 and not arch.num_experts:
            raise ValueError(f"--expert-model-parallel-size {mp.ep} / --expert-tensor-parallel-size {mp.etp} need an "
                             f"MoE model; {path} is dense")

    def _build(self, path: str) -> torch.nn.Module:
        from transformers import AutoConfig

        from relax.utils.multimodal.models import is_multimodal

        spec, mp = self.spec, self.spec.model_parallel
        if spec.head == "value" and mp.pp > 1:
            raise NotImplementedError(f"the megatron critic does not run pipeline parallelism yet: "
                                      f"--pipeline-model-parallel-size {mp.pp}; use 1")
        hf_config = AutoConfig.from_pretrained(path)
        self.vision = None  # a VL model's tower, positions and names (vision.py)
        if is_multimodal(hf_config):
            check_supported(hf_config, mp.pp, mp.cp)
            self.vision = VisionSide(hf_config)
        text_config = hf_config.text_config if self.vision else hf_config
        self.hf_config, self.pad_id = hf_config, text_config.pad_token_id or 0
        # The vocabulary padded as megatron pads it: to a multiple of --make-vocab-size-divisible-by
        # times the tensor-parallel size (convert.Layout.padded), so any tokenizer splits over TP.
        divisible_by = mp.arch_flags.get("make_vocab_size_divisible_by") or 128
        self.arch = arch = Layout.from_hf_config(text_config, mp.model_name).padded(divisible_by * mp.tp)
        self._check(path, text_config)
        self.layers = stage_layers(arch.num_layers, mp.pp, mp.first_stage_layers, mp.last_stage_layers)[self.pp_rank]
        self.config = transformer_config(arch, mp, bf16=spec.optim.bf16, norm_eps=text_config.rms_norm_eps)
        self.experts = expert_range(arch.num_experts, mp.ep, self.ep_rank) if arch.num_experts else None
        model = self._stage_model(text_config)
        hf_state = read_hf_state(path)
        if self.vision:
            hf_state, tower_states = split_state(hf_state)
            for tower, module in self.vision.build_towers(tower_states).items():
                setattr(model, tower, module)
            self.vision.install(model)
        if spec.head == "value":
            self._add_value_head(model, hf_state)
        self._load_hf(model, hf_state)
        model = model.to(self.device)
        if spec.compile_layers and self.device.type == "cuda":  # --use-torch-compile, as fsdp does
            compile_shim.compile_layers(model.decoder.layers)  # one graph per layer (compile_shim.py)
        if not spec.trainable:
            model.requires_grad_(False)
        if spec.policy:
            apply_freezing(model, spec.optim)
        self.main = self._main_weights(model) if spec.optim.bf16 else {}
        return model

    def _stage_model(self, text_config: Any) -> torch.nn.Module:
        """This stage's GPTModel: the default build, or --custom-model-provider-path's model (given the
        default build to wrap); under --allgather-cp its RoPE cut to this rank's contiguous chunk."""
        arch, mp = self.arch, self.spec.model_parallel

        def default(pre_process: bool = True, post_process: bool = True, **_: Any) -> torch.nn.Module:
            return build_gpt(arch, self.config, pre_process=pre_process, post_process=post_process,
                             rope_theta=rope_theta(text_config), num_layers=len(self.layers),
                             max_positions=getattr(text_config, "max_position_embeddings", 4096))

        model = provided_model(mp.model_provider, default, config=self.config, pre_process=self.first_stage,
                               post_process=self.last_stage) if mp.model_provider else \
            default(self.first_stage, self.last_stage)
        if mp.cp > 1 and mp.allgather_cp:
            install_cp_rope(model.rotary_pos_emb, mp.cp, self.cp_rank)
        return model

    def experts_differ_over_dp(self) -> bool:
        """Whether this rank's data-parallel peers hold other expert shards than it does (expert or
        expert tensor parallelism carved out of the data-parallel ranks; a collective over them)."""
        if not self.arch.num_experts or self.dp_size == 1:
            return False
        mine = torch.tensor([self.ep_rank, self.etp_rank], device=self.device)
        peers = [torch.empty_like(mine) for _ in range(self.dp_size)]
        dist.all_gather(peers, mine, group=self.ps.get_data_parallel_group())
        return any(not torch.equal(p, mine) for p in peers)

    def cp_positions(self, length: int) -> torch.Tensor:
        """The positions this rank holds of a row of `length` under context parallelism (`attention.py`)."""
        return cp_positions(length, self.cp_size, self.cp_rank, self.spec.model_parallel.allgather_cp)

    def _add_value_head(self, model: torch.nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
        """A scalar head (hidden -> 1, with bias) on the final norm's output, as the fsdp
        critic's `score` (`AutoModelForTokenClassification`, `num_labels=1`): read from the
        checkpoint's `score.*` when it has them (a critic checkpoint), else initialised as
        transformers initialises it (normal(0, initializer_range), bias 0). The language-model
        head is not used: an untied one is frozen (zeros when the checkpoint has none)."""
        head = torch.nn.Linear(self.arch.hidden_size, 1)
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
        if not self.arch.tied:
            hf_state.setdefault("lm_head.weight", torch.zeros(self.arch.vocab_size, self.arch.hidden_size))
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

    def shard(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full Megatron tensors under global names -> this rank's local state (its shards only)."""
        return shard_state(full, tp=self.tp_size, tp_rank=self.tp_rank, layers=self.layers, experts=self.experts,
                           first_stage=self.first_stage, last_stage=self.last_stage, tied=self.arch.tied,
                           etp=self.etp_size, etp_rank=self.etp_rank)

    def _load_hf(self, model: torch.nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
        local = self.shard(hf_to_megatron(hf_state, self.arch))
        result = model.load_state_dict(local, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")
                   and not k.startswith(("value_head.", *TOWER_PREFIXES))]  # the critic's head, the encoders: apart
        if missing or result.unexpected_keys:
            provider = self.spec.model_parallel.model_provider
            raise RuntimeError(f"the converted checkpoint does not fit the Megatron model: missing {missing[:5]}, "
                               f"unexpected {result.unexpected_keys[:5]}" + (
                                   f" (--custom-model-provider-path {provider}: its model must have the default "
                                   "model's parameters)" if provider else ""))

    def grads(self) -> Iterator[tuple[str, torch.nn.Parameter, torch.Tensor]]:
        """(name, model weight, its gradient) of every weight with one (the main weight's under --bf16)."""
        for name, p in self.model.named_parameters():
            grad = self.main[name].grad if name in self.main else p.grad
            if grad is not None:
                yield name, p, grad
