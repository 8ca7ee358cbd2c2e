# Qwen3-Omni-30B-A3B-Instruct: the thinker's language model (Megatron flags), from the published
# config.json's `thinker_config.text_config`: 48 MoE layers of 128 experts, 8 per token,
# rope_theta 1e6 (M-RoPE), a 152064-token vocabulary. Every layer is MoE, so --ffn-hidden-size
# repeats the config's (unused) dense intermediate_size, 768. The audio and vision encoders and
# the talker / code2wav parts are read from the HF checkpoint itself, not from flags.
# Train it with --expert-model-parallel-size (docs/backends/megatron.md).
# Checked by tests/unit/scripts/test_model_scripts.py.
MODEL_ARGS=(
  --swiglu
  --num-layers 48
  --hidden-size 2048
  --ffn-hidden-size 768
  --num-attention-heads 32
  --group-query-attention
  --num-query-groups 4
  --use-rotary-position-embeddings
  --disable-bias-linear
  --normalization "RMSNorm"
  --norm-epsilon 1e-6
  --rotary-base 1000000
  --vocab-size 152064
  --kv-channels 128
  --qk-layernorm
  --untie-embeddings-and-output-weights
  --num-experts 128
  --moe-ffn-hidden-size 768
  --moe-router-topk 8
)
