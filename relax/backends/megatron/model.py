"""megatron-core `GPTModel`s built from an HF `config.json`, and HF checkpoints read into them.

`Layout` (convert.py) holds the shapes; `transformer_config` turns it and the parallel layout
into megatron-core's `TransformerConfig` with the local (non-Transformer-Engine) layer spec and
PyTorch's SDPA as the attention core (`attention.py`), which runs on CPUs and on GPUs without
Transformer Engine: RMSNorm, SwiGLU, GQA, RoPE (M-RoPE for a VL model's language model), q/k norms,
biases on q/k/v where the family has them, tied or untied embeddings, MoE with top-k routing.
`check_arch_flags` compares the seed's model flags (`--num-layers`, `--hidden-size`, ... from
`scripts/models/*.sh`) with the checkpoint's config and names each mismatch.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from relax.backends.base import ModelParallelSpec
from relax.backends.megatron.convert import ConversionError, Layout


def transformer_config(layout: Layout, par: ModelParallelSpec, *, bf16: bool = False, norm_eps: float = 1e-6) -> Any:
    """megatron-core's TransformerConfig for `layout` under the run's model-parallel layout and
    recomputation flags (`par`)."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe = {}
    if layout.num_experts:
        moe = dict(num_moe_experts=layout.num_experts, moe_ffn_hidden_size=layout.moe_ffn_hidden_size,
                   moe_router_topk=layout.moe_top_k, moe_router_load_balancing_type="none",
                   moe_token_dispatcher_type="allgather", moe_grouped_gemm=False, moe_aux_loss_coeff=0.0,
                   moe_router_pre_softmax=False)
    recompute = {}
    if par.recompute_granularity:
        recompute = dict(recompute_granularity=par.recompute_granularity, recompute_method=par.recompute_method,
                         recompute_num_layers=par.recompute_num_layers)
        if par.recompute_granularity == "full" and par.recompute_method is None:
            recompute |= dict(recompute_method="uniform", recompute_num_layers=1)
    return TransformerConfig(
        num_layers=layout.num_layers, hidden_size=layout.hidden_size, num_attention_heads=layout.num_heads,
        num_query_groups=layout.num_kv_heads, kv_channels=layout.head_dim, ffn_hidden_size=layout.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=layout.qkv_bias, qk_layernorm=layout.qk_norm,
        hidden_dropout=0.0, attention_dropout=0.0,
        # The fused kernels are CUDA-only or need Apex / Transformer Engine; the unfused ones are exact.
        bias_activation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, bias_dropout_fusion=False,
        tensor_model_parallel_size=par.tp, pipeline_model_parallel_size=par.pp, context_parallel_size=par.cp,
        expert_model_parallel_size=par.ep, expert_tensor_parallel_size=par.etp, sequence_parallel=par.sequence_parallel,
        num_layers_in_first_pipeline_stage=par.first_stage_layers,
        num_layers_in_last_pipeline_stage=par.last_stage_layers,
        use_cpu_initialization=True, params_dtype=torch.float32, bf16=bf16, fp16=False,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        # Pipeline stages: p2p one op at a time (gloo has no batched p2p); each loss is already
        # normalised by the step's tokens (the schedule must not divide it by the micro-batch
        # count). Micro-batches are padded to one shape per schedule (the worker's `_pipeline`):
        # the all-gather MoE dispatcher refuses variable sequence lengths.
        batch_p2p_comm=par.pp == 1, calculate_per_token_loss=par.pp > 1,
        mrope_section=list(layout.mrope_section) or None,
        **moe, **recompute,
    )


def build_gpt(layout: Layout, config: Any, *, pre_process: bool, post_process: bool,
              rope_theta: float, max_positions: int, num_layers: int) -> Any:
    """`num_layers`: this pipeline stage's."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from relax.backends.megatron.attention import RMSNorm, SDPACoreAttention

    spec = get_gpt_layer_local_spec(num_experts=layout.num_experts or None, moe_grouped_gemm=False,
                                    qk_layernorm=layout.qk_norm, normalization="RMSNorm")
    sub = spec.submodules  # attention.py says why both are replaced
    sub.self_attention.submodules.core_attention = SDPACoreAttention
    sub.input_layernorm = sub.pre_mlp_layernorm = RMSNorm
    if layout.qk_norm:
        sub.self_attention.submodules.q_layernorm = sub.self_attention.submodules.k_layernorm = RMSNorm
    block = TransformerBlockSubmodules(layer_specs=[spec] * num_layers, layer_norm=RMSNorm)
    model = GPTModel(config, block, vocab_size=layout.vocab_rows, max_sequence_length=max_positions,
                    pre_process=pre_process, post_process=post_process,
                    share_embeddings_and_output_weights=layout.tied,
                    position_embedding_type="mrope" if layout.mrope_section else "rope",
                    rotary_base=int(rope_theta) if float(rope_theta).is_integer() else rope_theta,
                    parallel_output=True)
    if layout.mrope_interleaved:
        model.rotary_pos_emb = InterleavedMRoPE(layout.head_dim, rope_theta)
    return model


MODEL_PROVIDER = "model_provider(pre_process, post_process[, vp_stage, config, default_provider]) -> model"
PROVIDER_OPTIONAL = ("vp_stage", "config", "default_provider")  # passed when the provider names them


def provided_model(path: str, default: Any, *, config: Any, pre_process: bool, post_process: bool) -> Any:
    """--custom-model-provider-path: the user's provider called with keywords, as slime calls it, plus
    the optional keywords it takes: `vp_stage` (None: no virtual pipeline stages), `config` (this
    stage's megatron-core TransformerConfig) and `default_provider` (`default(pre_process=,
    post_process=)`, the model this backend builds, for a provider that wraps or patches it)."""
    from relax.utils.plugins import PluginError, accepts_keyword, load_plugin

    flag = "--custom-model-provider-path"
    optional = {"vp_stage": None, "config": config, "default_provider": default}
    provider = load_plugin(path, flag=flag, positional=0, keywords=("pre_process", "post_process"),
                           optional=PROVIDER_OPTIONAL, expected=MODEL_PROVIDER)
    model = provider(pre_process=pre_process, post_process=post_process,
                     **{k: v for k, v in optional.items() if accepts_keyword(provider, k)})
    if not isinstance(model, torch.nn.Module):
        raise PluginError(f"{flag}: {path} returned {type(model).__name__}, not a torch.nn.Module; expected "
                          f"{MODEL_PROVIDER}")
    return model


class InterleavedMRoPE(torch.nn.Module):
    """Qwen3-VL's M-RoPE: frequency i of a head's rotary half follows the height position when
    i % 3 == 1 (i < 3 x section[1]), the width position when i % 3 == 2 (i < 3 x section[2]) and
    the temporal one otherwise (megatron-core's `MultimodalRotaryEmbedding` assigns contiguous
    sections, Qwen2-VL's layout). Called as the GPT model calls that one:
    `(position_ids [3, B, S], mrope_section)` -> `[S, B, 1, head_dim]`."""

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32)
                                                         / head_dim)), persistent=False)

    def forward(self, position_ids: torch.Tensor, mrope_section: list[int], cp_group: Any = None) -> torch.Tensor:
        freqs = position_ids.to(self.inv_freq.device).float()[..., None] * self.inv_freq  # [3, B, S, D/2]
        thw = freqs[0].clone()
        for dim in (1, 2):
            index = slice(dim, 3 * mrope_section[dim], 3)
            thw[..., index] = freqs[dim, ..., index]
        emb = torch.cat((thw, thw), dim=-1)  # [B, S, D]
        return emb[:, :, None, :].transpose(0, 1).contiguous()


def rope_theta(config: Any) -> float:
    """`rope_theta` from the config (transformers >= 5 keeps it under `rope_parameters`)."""
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") not in ("default", None):
        raise ConversionError(f"rope_type {params['rope_type']!r} is not supported by the megatron backend yet "
                              "(plain RoPE only)")
    return float(params.get("rope_theta") or getattr(config, "rope_theta", 10000.0))


def read_hf_state(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of an HF checkpoint directory (safetensors, sharded or not), under the
    checkpoint's own names."""
    from safetensors.torch import load_file

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors(.index.json); the megatron backend reads "
                                "safetensors HF checkpoints")
    out: dict[str, torch.Tensor] = {}
    for name in files:
        out |= load_file(os.path.join(path, name))
    return out


# Seed model flag -> (what the HF config says, how to read it from a Layout and the config).
ARCH_FLAGS: dict[str, Any] = {
    "num_layers": lambda lay, cfg: lay.num_layers,
    "hidden_size": lambda lay, cfg: lay.hidden_size,
    "ffn_hidden_size": lambda lay, cfg: lay.ffn_hidden_size,
    "num_attention_heads": lambda lay, cfg: lay.num_heads,
    "num_query_groups": lambda lay, cfg: lay.num_kv_heads,
    "kv_channels": lambda lay, cfg: lay.head_dim,
    "qk_layernorm": lambda lay, cfg: lay.qk_norm,
    "untie_embeddings_and_output_weights": lambda lay, cfg: not lay.tied,
    "group_query_attention": lambda lay, cfg: lay.num_kv_heads < lay.num_heads,  # set: grouped K/V heads
    "norm_epsilon": lambda lay, cfg: cfg.rms_norm_eps,
    "rotary_base": lambda lay, cfg: rope_theta(cfg),
    "num_experts": lambda lay, cfg: lay.num_experts or None,
    "moe_ffn_hidden_size": lambda lay, cfg: lay.moe_ffn_hidden_size or None,
    "moe_router_topk": lambda lay, cfg: lay.moe_top_k or None,
}


# Flags that state something when set; unset (False) they state nothing (the HF config decides).
STATED_WHEN_SET = ("qk_layernorm", "untie_embeddings_and_output_weights", "group_query_attention")


def check_arch_flags(flags: dict[str, Any], layout: Layout, hf_config: Any, checkpoint: str) -> None:
    """The model flags given on the command line must describe the checkpoint they train."""
    wrong = []
    for flag, read in ARCH_FLAGS.items():
        given = flags.get(flag)
        if given is None or given is False and flag in STATED_WHEN_SET:
            continue
        actual = read(layout, hf_config)
        if isinstance(given, float) or isinstance(actual, float):
            same = actual is not None and abs(float(given) - float(actual)) <= 1e-12 * max(1.0, abs(float(actual)))
        else:
            same = given == actual
        if not same:
            wrong.append(f"--{flag.replace('_', '-')} {given} but {checkpoint}/config.json says {actual}")
    if wrong:
        raise ConversionError("the model flags disagree with the checkpoint (fix the model script in "
                              "scripts/models/ or the checkpoint):\n  " + "\n  ".join(wrong))
