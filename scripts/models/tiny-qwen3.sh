# The CPU quickstart's tiny Qwen3 (built by examples/tiny_math/prepare.py). The fsdp backend
# reads its architecture from the HF config, so no Megatron flags are needed.
MODEL_ARGS=()
