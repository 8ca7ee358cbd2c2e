# Qwen3-VL-30B-A3B-Instruct: the language model's architecture (Megatron flags), from the published
# config.json's `text_config`: 48 MoE layers of 128 experts, 8 per token, rope_theta 5e6 (M-RoPE).
# The vision tower and the M-RoPE sections are read from the HF checkpoint itself, not from flags.
# Train it with --expert-model-parallel-size (docs/backends/megatron.md).
# Checked by tests/unit/scripts/test_model_scripts.py.
MODEL_ARGS=(
  --swiglu
  --num-layers 48
  --hidden-size 2048
  --ffn-hidden-size 6144
  --num-attention-heads 32
  --group-query-attention
  --num-query-groups 4
  --use-rotary-position-embeddings
  --disable-bias-linear
  --normalization "RMSNorm"
  --norm-epsilon 1e-6
  --rotary-base 5000000
  --vocab-size 151936
  --kv-channels 128
  --qk-layernorm
  --untie-embeddings-and-output-weights
  --num-experts 128
  --moe-ffn-hidden-size 768
  --moe-router-topk 8
)
