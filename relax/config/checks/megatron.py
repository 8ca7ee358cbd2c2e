"""The Megatron model and parallelism flags.

`check_model_flags`: the model flags of a launch script (`--num-layers`, `--hidden-size`, ...) must
agree with the checkpoint's config.json, whichever backend trains. `megatron_unfit`: what a run
needs that the megatron backend does not build (`--train-backend auto` then picks fsdp);
`check_megatron`: with `--train-backend megatron`, every Megatron flag it accepts acts and the
rest are errors naming the flag; `qkv_layout`: the micro-batch layout (--qkv-format) its ranks
run; `conversion_family`: the converter --model-name (or the checkpoint's model_type) picks;
`megatron_notes`: plan notes where a Megatron flag does less in this run than its name says.
Nothing here imports megatron-core.
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
    "megatron_to_hf_mode": ("cluster", "raw", "bridge conversion (megatron-bridge); raw converters only"),
}

# --attention-backend values the megatron backend runs: its attention is PyTorch SDPA (backends/megatron/
# attention.py), whose own dispatch takes the flash kernel on a GPU where it applies. megatron-core's other
# backends are Transformer Engine's (fused) or its DotProductAttention (unfused, local), neither built here.
ATTENTION_BACKENDS = ("auto", "flash")
ATTENTION_NOT_BUILT = "fused needs Transformer Engine, which this project's pins exclude; unfused and local are " \
    "megatron-core's DotProductAttention, replaced here by SDPA (it keeps the whole score matrix for backward)"


# The MLP activations the megatron backend builds (gated: SwiGLU); relax.backends.megatron.convert checks
# the same when it reads a config.
SWIGLU_ACTIVATIONS = ("silu", "swish")

# relax.backends.megatron.vision.SUPPORTED (not imported: validation runs without megatron-core)
MEGATRON_VL = ("qwen2_5_vl", "qwen3_vl", "qwen3_omni_moe_thinker")
# relax.backends.megatron.convert.FAMILIES' model_types: the families --model-name names (same reason)
MEGATRON_FAMILIES = ("llama", "mistral", "qwen2", "qwen2_5_vl_text", "qwen3", "qwen3_vl_text", "qwen3_moe",
                     "qwen3_omni_moe_text")


def _compact(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(".", "")


def conversion_family(name: str) -> str | None:
    """The converter family (a model_type of `MEGATRON_FAMILIES`) that `name` names: a model_type
    (`qwen3_moe`), slime's spelling (`qwen3moe`: the config class's name) or a VL model's type
    (`qwen2_5_vl`: its language model's family); None when no converter fits."""
    key = _compact(name)
    return next((f for f in MEGATRON_FAMILIES if _compact(f) in (key, key + "text")), None)


def _checkpoint_config(cfg: RelaxConfig) -> dict:
    config = Path(cfg.ckpt.hf_checkpoint or "") / "config.json"
    return json.loads(config.read_text()) if cfg.ckpt.hf_checkpoint and config.is_file() else {}


def qkv_layout(cfg: RelaxConfig) -> tuple[str, str]:
    """(layout, why) of the megatron ranks' micro-batches: "thd" packs each micro-batch's rows into one
    token stream, "bshd" right-pads them. --qkv-format thd runs padded (`why` names the reason) with
    pipeline or context parallelism, routing replay or a vision-language model, which pad rows."""
    if cfg.cluster.qkv_format == "bshd":
        return "bshd", ""
    p, a = cfg.parallel, cfg.algo
    vl = cfg.data.multimodal_keys or _checkpoint_config(cfg).get("model_type") in MEGATRON_VL
    why = [what for what, on in (
        (f"--pipeline-model-parallel-size {p.pipeline_model_parallel_size}", p.pipeline_model_parallel_size > 1),
        (f"--context-parallel-size {p.context_parallel_size}", p.context_parallel_size > 1),
        ("routing replay", a.use_routing_replay or a.use_rollout_routing_replay),
        ("a vision-language model", vl)) if on]
    return ("bshd", ", ".join(why)) if why else ("thd", "")


def megatron_notes(cfg: RelaxConfig) -> list[str]:
    """Plan notes for the Megatron flags that do less in this run than their name says."""
    if cfg.cluster.train_backend != "megatron":
        return []
    notes = []
    layout, why = qkv_layout(cfg)
    if cfg.cluster.qkv_format == "thd" and layout == "bshd":
        notes.append(f"--qkv-format thd: rows are right-padded (bshd) in this run: packed rows are not built with "
                     f"{why}")
    if cfg.megatron.attention_backend == "flash":
        notes.append("--attention-backend flash: attention is PyTorch SDPA, whose dispatch takes the flash kernel "
                     "on a GPU where it applies (fp16/bf16 causal rows; with context parallelism's explicit mask "
                     "another SDPA kernel) and the math kernel on CPU; nothing else to switch")
    if cfg.megatron.recompute_loss_function and cfg.parallel.tensor_model_parallel_size == 1:
        notes.append("--recompute-loss-function: with one tensor-parallel rank the chunked output layer keeps no "
                     "logits for backward anyway (it recomputes each chunk's); nothing to switch")
    if cfg.optim.use_distributed_optimizer and experts_differ_over_dp(cfg):
        notes.append("--use-distributed-optimizer: the data-parallel ranks hold different experts (expert or expert "
                     "tensor parallelism carved out of them), so the optimizer state is not sharded: ZeRO-1 here "
                     "shards over data-parallel ranks holding the same weights; each rank keeps its own weights' state")
    return notes


def experts_differ_over_dp(cfg: RelaxConfig) -> bool:
    """An MoE model whose data-parallel peers hold other expert shards: in megatron-core's rank order
    a peer is tp x cp ranks away, and a rank's expert shard repeats every etp x ep ranks."""
    p, text = cfg.parallel, text_model_config(_checkpoint_config(cfg))
    moe = text.get("num_experts") or text.get("num_local_experts")
    shards = p.expert_tensor_parallel_size * p.expert_model_parallel_size
    return bool(moe) and (p.tensor_model_parallel_size * p.context_parallel_size) % shards != 0


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
    hf = _checkpoint_config(cfg)
    text_type = text_model_config(hf).get("model_type") if hf else None
    if text_type and cfg.misc.model_name is None and conversion_family(text_type) is None:
        reasons.append(f"model_type {text_type}: the megatron backend converts {', '.join(MEGATRON_FAMILIES)}; set "
                       "--model-name to the family this model's layers follow, or use --train-backend fsdp")
    act = text_model_config(hf).get("hidden_act", "silu") if hf else "silu"
    if act not in SWIGLU_ACTIVATIONS:
        reasons.append(f"hidden_act {act} in {cfg.ckpt.hf_checkpoint}/config.json: the megatron backend builds SwiGLU "
                       "(silu-gated) MLPs only; use --train-backend fsdp")
    if cfg.data.multimodal_keys:
        p = cfg.parallel
        model_type = hf.get("model_type")
        if hf and model_type not in MEGATRON_VL:
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
        if value != default:
            raise ConfigError(f"{flag_for(name)} {value}: the megatron backend does not build {what} yet; "
                              "drop the flag")
    attention = cfg.megatron.attention_backend
    if attention not in (None, *ATTENTION_BACKENDS):
        raise ConfigError(f"--attention-backend {attention}: the megatron backend runs "
                          f"{' or '.join(ATTENTION_BACKENDS)} (PyTorch SDPA attention); {ATTENTION_NOT_BUILT}. "
                          "Use --attention-backend flash or drop the flag")
    p, m = cfg.parallel, cfg.megatron
    unfit = megatron_unfit(cfg)
    if unfit:
        raise ConfigError(f"--train-backend megatron: {unfit[0]}")
    check_megatron_run_flags(cfg, hf)
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


def check_megatron_run_flags(cfg: RelaxConfig, hf: dict) -> None:
    """--qkv-format bshd without dynamic batching (the seeds' rule), a known --model-name, and an
    --expert-tensor-parallel-size that splits every expert of an MoE model."""
    ref_budget = (cfg.cluster.ref_actor_config or {}).get("max_tokens_per_gpu")
    if cfg.cluster.qkv_format == "bshd" and (cfg.batch.use_dynamic_batch_size or ref_budget):
        flag = "--use-dynamic-batch-size" if cfg.batch.use_dynamic_batch_size else \
            "--ref-actor-config max_tokens_per_gpu (dynamic batching for the Reference and ActorFwd)"
        raise ConfigError(f"--qkv-format bshd with {flag}: dynamic batching is not supported in bshd mode; "
                          "micro-batches are --micro-batch-size rows: drop it, or use --qkv-format thd")
    name = cfg.misc.model_name
    if name is not None and conversion_family(name) is None:
        raise ConfigError(f"--model-name {name}: no Megatron<->HF conversion by that name; known: "
                          f"{', '.join(MEGATRON_FAMILIES)} (slime's spellings such as qwen3moe too)")
    etp = cfg.parallel.expert_tensor_parallel_size
    text = text_model_config(hf)
    experts, ffn = text.get("num_experts") or text.get("num_local_experts"), text.get("moe_intermediate_size")
    if etp > 1 and hf and not experts:
        raise ConfigError(f"--expert-tensor-parallel-size {etp} needs an MoE model; {cfg.ckpt.hf_checkpoint} is "
                          "dense: use 1")
    if etp > 1 and ffn and ffn % etp:
        raise ConfigError(f"--expert-tensor-parallel-size {etp} does not split the experts' FFN "
                          f"(moe_intermediate_size {ffn}); use a divisor of it")
