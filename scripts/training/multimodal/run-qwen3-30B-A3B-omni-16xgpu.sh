#!/bin/bash
# Qwen3-Omni-30B-A3B-Instruct (the thinker: MoE, 128 experts; image + audio), fully async GRPO on
# AVQA-R1-6K (multiple-choice reward), two nodes of 8 GPUs (the seeds' Task 3): node 0 trains (8
# fsdp ranks: the megatron backend takes a thinker-only checkpoint, qwen3_omni_moe_thinker, and the
# published checkpoint is the whole Omni model), node 1 generates (4 SGLang engines of 2 GPUs).
# Each role stays in one node (a role's engines are child processes of its one replica).
#
#   hf download --repo-type dataset harryhsing/AVQA-R1-6K --local-dir ${DATA_DIR}/AVQA-R1-6K
#   hf download Qwen/Qwen3-Omni-30B-A3B-Instruct --local-dir ${MODEL_DIR}/Qwen3-Omni-30B-A3B-Instruct
#   python scripts/tools/process_avqa.py \
#     --input-dir ${DATA_DIR}/AVQA-R1-6K/AVQA_R1/train/omni_rl_format_train.json \
#     --output-dir ${DATA_DIR}/AVQA-R1-6K/AVQA_R1/train/omni_rl_format_train_test.jsonl \
#     --md-dir ${DATA_DIR}/AVQA-R1-6K/AVQA_R1/train
#   bash scripts/entrypoint/spmd-multinode.sh scripts/training/multimodal/run-qwen3-30B-A3B-omni-16xgpu.sh  # on both nodes
#
# Check it first, anywhere (no GPU, no weights: the model's config.json and the data file are read):
#   bash scripts/training/multimodal/run-qwen3-30B-A3B-omni-16xgpu.sh --dry-run --cluster '{"nodes": 2, "gpus_per_node": 8}'
# The old log-probs are the engines' (--use-rollout-logprobs: no ActorFwd role), corrected by --use-tis.
# EXP_DIR (default /root) must be on a filesystem both nodes mount. Environment: EXP_DIR, MODEL_DIR,
# DATA_DIR (default EXP_DIR), NUM_ROLLOUT (200).
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/qwen3-omni-30B-A3B.sh"

EXP_DIR="${EXP_DIR:-/root}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-200}"

python3 relax/entrypoints/train.py \
  --fully-async --max-staleness 2 --use-tis --use-rollout-logprobs \
  --resource '{"actor": [1, 8], "rollout": [1, 8], "advantages": [1, 0]}' \
  --exp-dir "${EXP_DIR}/runs/qwen3-omni-30B-A3B-async" \
  "${MODEL_ARGS[@]}" \
  --hf-checkpoint "${MODEL_DIR}/Qwen3-Omni-30B-A3B-Instruct" --ref-load "${MODEL_DIR}/Qwen3-Omni-30B-A3B-Instruct" \
  --save "${EXP_DIR}/ckpt/qwen3-omni-30B-A3B-async" --save-interval 20 \
  --prompt-data "${DATA_DIR}/AVQA-R1-6K/AVQA_R1/train/omni_rl_format_train_test.jsonl" \
  --input-key prompt --label-key label --apply-chat-template \
  --multimodal-keys '{"image": "image_key", "audio": "audio_key"}' \
  --rm-type multiple_choice --rollout-shuffle \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 \
  --rollout-max-response-len 2048 --rollout-temperature 1.0 \
  --advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28 --entropy-coef 0 \
  --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 \
  --train-backend fsdp --recompute-granularity full \
  --use-dynamic-batch-size --max-tokens-per-gpu 8192 \
  --rollout-num-gpus-per-engine 2 --bf16 \
  --use-tensorboard --tb-experiment-name qwen3-omni-30B-A3B-async "$@"
