# Qwen3-VL-4B-Instruct: the language model's architecture (Megatron flags), from the published
# config.json's `text_config` (a Qwen3-4B-shaped dense decoder with rope_theta 5e6 and M-RoPE).
# The vision tower, the M-RoPE sections and the image/video token ids are read from the HF
# checkpoint itself, not from flags. Checked by tests/unit/scripts/test_model_scripts.py.
MODEL_ARGS=(
  --swiglu
  --num-layers 36
  --hidden-size 2560
  --ffn-hidden-size 9728
  --num-attention-heads 32
  --group-query-attention
  --num-query-groups 8
  --use-rotary-position-embeddings
  --disable-bias-linear
  --normalization "RMSNorm"
  --norm-epsilon 1e-6
  --rotary-base 5000000
  --vocab-size 151936
  --kv-channels 128
  --qk-layernorm
)
