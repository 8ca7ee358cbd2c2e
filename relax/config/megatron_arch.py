"""The megatron architecture flags (`scripts/models/*.sh`) and the megatron backend's own model
flags (loss recomputation, context-parallel split, a custom model provider), one config group of
`schema.RelaxConfig`, and the reason every megatron-only flag gives when the fsdp backend runs (kept
apart from schema.py for its size)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relax.config.fields import opt

# Why a flag is accepted with no effect (`opt(ignored=...)`): under --train-backend megatron each
# of these acts or is an error (relax.config.checks.megatron.check_megatron, docs/backends/megatron.md).
MEGATRON_ONLY = "applies to the megatron training backend (docs/backends/megatron.md); the fsdp backend ignores it"
# Megatron-only flags that change nothing under the megatron backend either: what they ask for is always
# so there, or it is not read. A set value is noted with the reason under both backends ("no effect" in
# docs/configuration.md, relax.config.status).
MEGATRON_NO_EFFECT: dict[str, str] = {
    "swiglu": "the megatron backend always builds SwiGLU MLPs (a checkpoint with another hidden_act is refused)",
    "use_rotary_position_embeddings": "the megatron backend always builds rotary position embeddings (M-RoPE for a "
                                      "vision-language model), with config.json's parameters",
    "disable_bias_linear": "the megatron backend builds its linear layers without biases (q/k/v biases come with "
                           "the model family; a checkpoint with other biases is refused)",
    "accumulate_allreduce_grads_in_fp32": "always so: under --bf16 the megatron backend accumulates each micro-batch's "
                                          "gradients into float32 main gradients and all-reduces those (without "
                                          "--bf16 everything is float32)",
    "attention_softmax_in_fp32": "not read: attention is PyTorch SDPA, whose kernels choose the softmax's precision",
}


@dataclass(frozen=True)
class MegatronArchConfig:
    """Megatron architecture flags from `scripts/models/*.sh`. With the fsdp backend the HF
    config is the source of truth; a value that contradicts it is an error. The last three are the
    megatron backend's own (docs/backends/megatron.md)."""

    num_layers: int | None = opt(None, "Transformer layers (megatron).", ignored=MEGATRON_ONLY)
    hidden_size: int | None = opt(None, "Hidden size (megatron).", ignored=MEGATRON_ONLY)
    ffn_hidden_size: int | None = opt(None, "FFN hidden size (megatron).", ignored=MEGATRON_ONLY)
    num_attention_heads: int | None = opt(None, "Attention heads (megatron).", ignored=MEGATRON_ONLY)
    group_query_attention: bool = opt(False, "GQA (megatron; an error with a checkpoint that has as many KV heads as "
                                      "heads).", ignored=MEGATRON_ONLY)
    num_query_groups: int | None = opt(None, "KV heads (megatron).", ignored=MEGATRON_ONLY)
    kv_channels: int | None = opt(None, "Head dim (megatron).", ignored=MEGATRON_ONLY)
    vocab_size: int | None = opt(None, "Vocab size (megatron).", ignored=MEGATRON_ONLY)
    make_vocab_size_divisible_by: int = opt(
        128, "Megatron pads the vocabulary of its embedding and output layer to a multiple of this times "
        "--tensor-model-parallel-size (any tokenizer then splits over the tensor-parallel ranks); the padded rows "
        "are never sampled or trained, and pushed and exported weights carry the checkpoint's vocabulary.",
        ignored=MEGATRON_ONLY)
    swiglu: bool = opt(False, "SwiGLU (megatron).", ignored=MEGATRON_ONLY)
    use_rotary_position_embeddings: bool = opt(False, "RoPE (megatron).", ignored=MEGATRON_ONLY)
    disable_bias_linear: bool = opt(False, "No linear bias (megatron).", ignored=MEGATRON_ONLY)
    normalization: str | None = opt(None, "Norm type (megatron).", ignored=MEGATRON_ONLY)
    norm_epsilon: float | None = opt(None, "Norm epsilon (megatron).", ignored=MEGATRON_ONLY)
    rotary_base: float | None = opt(None, "RoPE base (megatron).", ignored=MEGATRON_ONLY)
    qk_layernorm: bool = opt(False, "QK norm (megatron).", ignored=MEGATRON_ONLY)
    untie_embeddings_and_output_weights: bool = opt(False, "Untied embeddings (megatron).", ignored=MEGATRON_ONLY)
    attention_dropout: float | None = opt(None, "Attention dropout (megatron).", ignored=MEGATRON_ONLY)
    hidden_dropout: float | None = opt(None, "Hidden dropout (megatron).", ignored=MEGATRON_ONLY)
    accumulate_allreduce_grads_in_fp32: bool = opt(False, "fp32 grad reduce (megatron).", ignored=MEGATRON_ONLY)
    attention_softmax_in_fp32: bool = opt(False, "fp32 softmax (megatron).", ignored=MEGATRON_ONLY)
    attention_backend: Literal["flash", "fused", "unfused", "local", "auto"] | None = opt(
        None, "Attention backend (megatron): auto and flash run PyTorch SDPA attention (the flash kernel on a GPU "
        "where it applies).", ignored=MEGATRON_ONLY)
    num_experts: int | None = opt(None, "MoE experts per layer (megatron; checked against num_experts).",
                                  ignored=MEGATRON_ONLY)
    moe_ffn_hidden_size: int | None = opt(None, "Expert FFN size (megatron; checked against moe_intermediate_size).",
                                          ignored=MEGATRON_ONLY)
    moe_router_topk: int | None = opt(None, "Experts per token (megatron; checked against num_experts_per_tok).",
                                      ignored=MEGATRON_ONLY)
    recompute_loss_function: bool = opt(
        False, "The output layer and log-softmax run under activation checkpointing: no [tokens, vocab] logits kept "
        "for backward, recomputed there (megatron TP > 1; the chunked head of fsdp and of megatron TP = 1 "
        "recomputes each chunk's logits always).", ignored=MEGATRON_ONLY)
    allgather_cp: bool = opt(
        False, "Context parallelism splits each row into C contiguous chunks (rank r holds chunk r) instead of the "
        "load-balanced 2C chunks (r and 2C-1-r); K/V are all-gathered over the group either way.",
        ignored=MEGATRON_ONLY)
    custom_model_provider_path: str | None = opt(
        None, "fn(pre_process, post_process[, vp_stage, config, default_provider]) -> the megatron-core model to "
        "train, called with keywords (default_provider(pre_process=, post_process=) builds the default one); its "
        "parameters must be the default model's. Needs --train-backend megatron.")
