#!/bin/bash
# Qwen3-4B, GRPO on DAPO-Math-17k, colocate, one node of 8 GPUs (the seeds' Task 1).
#
#   hf download --repo-type dataset zhuzilin/dapo-math-17k --local-dir ${DATA_DIR}/dapo-math-17k
#   hf download Qwen/Qwen3-4B --local-dir ${MODEL_DIR}/Qwen3-4B
#   EXP_DIR=/root bash scripts/training/text/run-qwen3-4B-8xgpu.sh [EXTRA RELAX FLAGS...]
#
# Check it first, anywhere (no GPU, no weights: the model's config.json and the data file are read):
#   bash scripts/training/text/run-qwen3-4B-8xgpu.sh --dry-run --cluster '{"nodes": 1, "gpus_per_node": 8}'
# Layout: the 8 training ranks and 8 engines take turns on the 8 GPUs (colocate: the engines release
# their memory while the trainer runs, the trainer offloads while they generate). auto picks
# megatron + sglang on the GPU image (docker/Dockerfile), fsdp + hf without them.
# Environment: EXP_DIR (default /root), MODEL_DIR, DATA_DIR (default EXP_DIR), NUM_ROLLOUT (200),
# MODE (colocate | async; run-qwen3-4B-8xgpu-async.sh sets async). Extra flags go to train.py (later wins).
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/qwen3-4B.sh"

EXP_DIR="${EXP_DIR:-/root}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-200}"
MODE="${MODE:-colocate}"

case "${MODE}" in
  colocate)
    MODE_ARGS=(--colocate)
    RESOURCE='{"actor": [1, 8], "rollout": [1, 8]}' ;;
  async)
    # Every role on GPUs of its own: 4 training ranks, 2 engines, 2 ActorFwd ranks (old log-probs; TP 2 as the actor).
    MODE_ARGS=(--fully-async --max-staleness 2 --use-tis)
    RESOURCE='{"actor": [1, 4], "rollout": [1, 2], "actor_fwd": [1, 2], "advantages": [1, 0]}' ;;
  *) echo "MODE must be colocate or async, got '${MODE}'" >&2; exit 2 ;;
esac

CKPT_ARGS=(
  --hf-checkpoint "${MODEL_DIR}/Qwen3-4B"
  --ref-load "${MODEL_DIR}/Qwen3-4B"
  --save "${EXP_DIR}/ckpt/qwen3-4B-${MODE}"
  --save-interval 20
)
ROLLOUT_ARGS=(
  --prompt-data "${DATA_DIR}/dapo-math-17k/dapo-math-17k.jsonl"
  --input-key prompt
  --label-key label
  --apply-chat-template
  --rollout-shuffle
  --rm-type dapo
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size 32
  --n-samples-per-prompt 8
  --rollout-max-response-len 8192
  --rollout-temperature 1.0
  --global-batch-size 256
)
ALGO_ARGS=(--advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28 --entropy-coef 0)
OPTIMIZER_ARGS=(--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9
                --adam-beta2 0.98)
PERF_ARGS=(
  --tensor-model-parallel-size 2 --sequence-parallel
  --use-dynamic-batch-size --max-tokens-per-gpu 9216
  --rollout-num-gpus-per-engine 1
  --bf16
)
LOG_ARGS=(--use-tensorboard --tb-experiment-name "qwen3-4B-${MODE}")

python3 relax/entrypoints/train.py \
  "${MODE_ARGS[@]}" --resource "${RESOURCE}" \
  --exp-dir "${EXP_DIR}/runs/qwen3-4B-${MODE}" \
  "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" \
  "${PERF_ARGS[@]}" "${LOG_ARGS[@]}" "$@"
