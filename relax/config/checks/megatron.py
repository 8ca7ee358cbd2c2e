"""The Megatron model and parallelism flags.

`check_model_flags`: the model flags of a launch script (`--num-layers`, `--hidden-size`, ...) must
agree with the checkpoint's config.json, whichever backend trains. `megatron_unfit`: what a run
needs that the megatron backend does not build (`--train-backend auto` then picks fsdp);
`check_megatron`: with `--train-backend megatron`, every Megatron flag it accepts acts and the
rest are errors naming the flag. Nothing here imports megatron-core.
"""

from __future__ import annotations

import json
from pathlib import Path

from relax.config.errors import ConfigError
from relax.config.fields import flag_for
from relax.config.schema import RelaxConfig


# Megatron flag -> HF config.json key(s), for the contradiction check (the first key present is
# compared; transformers 5 writes Qwen3-MoE's `num_experts` as `num_local_experts`).
ARCH_TO_HF = {
    "num_layers": ("num_hidden_layers",), "hidden_size": ("hidden_size",), "ffn_hidden_size": ("intermediate_size",),
    "num_attention_heads": ("num_attention_heads",), "num_query_groups": ("num_key_value_heads",),
    "kv_channels": ("head_dim",), "norm_epsilon": ("rms_norm_eps",), "rotary_base": ("rope_theta",),
    "num_experts": ("num_experts", "num_local_experts"), "moe_ffn_hidden_size": ("moe_intermediate_size",),
    "moe_router_topk": ("num_experts_per_tok",),
}


def text_model_config(hf: dict) -> dict:
    """The language model's part of a config.json (a VL model's `text_config`, an Omni model's
    `thinker_config.text_config`), with `rope_theta` from `rope_parameters` when only that has it."""
    text = hf.get("thinker_config", hf).get("text_config", hf.get("thinker_config", hf))
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return {**text, "rope_theta": text["rope_theta"]} if "rope_theta" in text else \
        {**text, **({"rope_theta": rope["rope_theta"]} if "rope_theta" in rope else {})}


def check_model_flags(cfg: RelaxConfig, hf: dict) -> None:
    """The Megatron model flags (from `scripts/models/*.sh`) must agree with the checkpoint's
    config.json (`hf`), whichever backend trains: the HF config is what both build the model from."""
    text = text_model_config(hf)
    for arch, hf_keys in ARCH_TO_HF.items():
        value = getattr(cfg.megatron, arch)
        hf_key = next((k for k in hf_keys if k in text), None)
        if value is not None and hf_key is not None and float(text[hf_key]) != float(value):
            raise ConfigError(f"{flag_for(arch)} {value} contradicts {cfg.ckpt.hf_checkpoint}/config.json "
                              f"{hf_key}={text[hf_key]}; the HF config is the source of truth (the "
                              f"{cfg.cluster.train_backend} backend builds its model from it): remove the flag or "
                              "fix the model script")


# Megatron flags the megatron backend does not act on yet: given a non-default value, an error.
MEGATRON_NOT_BUILT = {
    "expert_tensor_parallel_size": ("parallel", 1, "expert tensor parallelism (experts are whole per rank)"),
    "megatron_to_hf_mode": ("cluster", "raw", "bridge conversion (megatron-bridge); raw converters only"),
    "qkv_format": ("cluster", "thd", "the packed thd layout is not built; rows are right-padded (bshd)"),
    "attention_backend": ("megatron", None, "attention backends (the local unfused attention runs)"),
}


# relax.backends.megatron.vision.SUPPORTED (not imported: validation runs without megatron-core)
MEGATRON_VL = ("qwen2_5_vl", "qwen3_vl", "qwen3_omni_moe_thinker")


def megatron_unfit(cfg: RelaxConfig) -> list[str]:
    """What this run needs that the megatron backend does not build (auto then picks fsdp)."""
    reasons = []
    if cfg.algo.advantage_estimator == "ppo" and cfg.parallel.pipeline_model_parallel_size > 1:
        reasons.append("the critic (PPO) does not run with --pipeline-model-parallel-size > 1 on the megatron "
                       "backend yet; use 1 or --train-backend fsdp")
    if cfg.cluster.true_on_policy_mode:
        reasons.append("--true-on-policy-mode needs --train-backend fsdp")
    if cfg.lora.lora_rank > 0:  # megatron-core 0.16 has no LoRA layers (Megatron's LoRA is Megatron-Bridge's)
        reasons.append(f"--lora-rank {cfg.lora.lora_rank}: LoRA adapters train on the fsdp backend only (megatron-core "
                       "0.16 builds no LoRA layers; Megatron's LoRA lives in Megatron-Bridge, which this build "
                       "excludes); use --train-backend fsdp, or --lora-rank 0 to fine-tune every weight")
    if cfg.data.multimodal_keys:
        p = cfg.parallel
        config = Path(cfg.ckpt.hf_checkpoint or "") / "config.json"
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
        if config.is_file() and model_type not in MEGATRON_VL:
            reasons.append(f"--multimodal-keys with a {model_type or 'text'} model: the megatron backend trains the "
                           f"vision-language models {', '.join(MEGATRON_VL)}; use --train-backend fsdp")
        elif p.pipeline_model_parallel_size > 1 or p.context_parallel_size > 1:
            reasons.append("--multimodal-keys: a vision-language model runs without pipeline and context parallelism "
                           "on the megatron backend; set --pipeline-model-parallel-size and --context-parallel-size "
                           "to 1, or use --train-backend fsdp")
    return reasons


def check_megatron(cfg: RelaxConfig, hf: dict) -> None:
    """--train-backend megatron: every Megatron flag it accepts acts; the rest are errors here.
    `hf`: the checkpoint's config.json."""
    for name, (group, default, what) in MEGATRON_NOT_BUILT.items():
        value = getattr(getattr(cfg, group), name)
        if value != default and not (name == "qkv_format" and value == "bshd"):
            raise ConfigError(f"{flag_for(name)} {value}: the megatron backend does not build {what} yet; "
                              "drop the flag")
    p, m = cfg.parallel, cfg.megatron
    unfit = megatron_unfit(cfg)
    if unfit:
        raise ConfigError(f"--train-backend megatron: {unfit[0]}")
    if p.expert_tensor_parallel_size != 1:
        raise ConfigError("--expert-tensor-parallel-size must be 1 with the megatron backend")
    if p.context_parallel_size > 1 and p.pipeline_model_parallel_size > 1:
        raise ConfigError(f"--context-parallel-size {p.context_parallel_size} with --pipeline-model-parallel-size "
                          f"{p.pipeline_model_parallel_size}: the megatron backend does not run context and pipeline "
                          "parallelism together yet; set one of them to 1")
    for name in ("attention_dropout", "hidden_dropout"):
        value = getattr(m, name)
        if value not in (None, 0, 0.0):
            raise ConfigError(f"{flag_for(name)} {value}: RL training runs without dropout (the trainer's log-probs "
                              "must match the engine's); use 0")
    if m.normalization not in (None, "RMSNorm"):
        raise ConfigError(f"--normalization {m.normalization}: the supported families use RMSNorm")
    if m.vocab_size is not None and "vocab_size" in hf and int(hf["vocab_size"]) != m.vocab_size:
        raise ConfigError(f"--vocab-size {m.vocab_size} contradicts {cfg.ckpt.hf_checkpoint}/config.json "
                          f"vocab_size={hf['vocab_size']}")
