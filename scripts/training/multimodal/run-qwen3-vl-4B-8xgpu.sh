#!/bin/bash
# Qwen3-VL-4B-Instruct, GRPO on multimodal-open-r1-8k-verified (openr1mm reward), colocate, one node
# of 8 GPUs (the seeds' Task 2). The vision tower trains with the language model.
#
#   hf download --repo-type dataset lmms-lab/multimodal-open-r1-8k-verified --local-dir ${DATA_DIR}/multimodal-open-r1-8k-verified
#   hf download Qwen/Qwen3-VL-4B-Instruct --local-dir ${MODEL_DIR}/Qwen3-VL-4B-Instruct
#   python scripts/tools/process_openr1.py \
#     --input-dir ${DATA_DIR}/multimodal-open-r1-8k-verified/data/train-00000-of-00001.parquet \
#     --output-dir ${DATA_DIR}/multimodal-open-r1-8k-verified/data/train-00000-of-00001-test.parquet
#   EXP_DIR=/root bash scripts/training/multimodal/run-qwen3-vl-4B-8xgpu.sh [EXTRA RELAX FLAGS...]
#
# Check it first, anywhere (no GPU, no weights: the model's config.json and the data file are read):
#   bash scripts/training/multimodal/run-qwen3-vl-4B-8xgpu.sh --dry-run --cluster '{"nodes": 1, "gpus_per_node": 8}'
# Environment: EXP_DIR (default /root), MODEL_DIR, DATA_DIR (default EXP_DIR), NUM_ROLLOUT (200).
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/qwen3-vl-4B.sh"

EXP_DIR="${EXP_DIR:-/root}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-200}"

python3 relax/entrypoints/train.py \
  --colocate --resource '{"actor": [1, 8], "rollout": [1, 8]}' \
  --exp-dir "${EXP_DIR}/runs/qwen3-vl-4B" \
  "${MODEL_ARGS[@]}" \
  --hf-checkpoint "${MODEL_DIR}/Qwen3-VL-4B-Instruct" --ref-load "${MODEL_DIR}/Qwen3-VL-4B-Instruct" \
  --save "${EXP_DIR}/ckpt/qwen3-vl-4B" --save-interval 20 \
  --prompt-data "${DATA_DIR}/multimodal-open-r1-8k-verified/data/train-00000-of-00001-test.parquet" \
  --input-key prompt --label-key label --apply-chat-template --multimodal-keys '{"image": "image"}' \
  --rm-type openr1mm --rollout-shuffle \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 \
  --rollout-max-response-len 4096 --rollout-temperature 1.0 \
  --advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28 --entropy-coef 0 \
  --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --use-dynamic-batch-size --max-tokens-per-gpu 9216 \
  --rollout-num-gpus-per-engine 1 --bf16 \
  --use-tensorboard --tb-experiment-name qwen3-vl-4B "$@"
