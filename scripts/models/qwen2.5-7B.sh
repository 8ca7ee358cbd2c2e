# Qwen2.5-7B architecture (Megatron flags): biases on q/k/v only (--add-qkv-bias in Megatron's
# terms; the converter reads them from the checkpoint), no q/k norms, untied output layer.
MODEL_ARGS=(
  --swiglu
  --num-layers 28
  --hidden-size 3584
  --ffn-hidden-size 18944
  --num-attention-heads 28
  --group-query-attention
  --num-query-groups 4
  --use-rotary-position-embeddings
  --disable-bias-linear
  --normalization "RMSNorm"
  --norm-epsilon 1e-6
  --rotary-base 1000000
  --vocab-size 152064
  --untie-embeddings-and-output-weights
)
