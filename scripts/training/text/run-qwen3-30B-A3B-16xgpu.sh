#!/bin/bash
# Qwen3-30B-A3B (MoE, 128 experts), fully async GRPO on DAPO-Math-17k, two nodes of 8 GPUs:
# node 0 trains (8 megatron ranks: expert parallel 8, tensor parallel 2), node 1 generates
# (4 SGLang engines of 2 GPUs). Each role stays in one node: a role's engines are child processes
# of its one replica, and its ranks meet on their replica's node.
#
#   hf download --repo-type dataset zhuzilin/dapo-math-17k --local-dir ${DATA_DIR}/dapo-math-17k
#   hf download Qwen/Qwen3-30B-A3B --local-dir ${MODEL_DIR}/Qwen3-30B-A3B
#   bash scripts/entrypoint/spmd-multinode.sh scripts/training/text/run-qwen3-30B-A3B-16xgpu.sh  # on both nodes
#
# Check it first, anywhere (no GPU, no weights: the model's config.json and the data file are read):
#   bash scripts/training/text/run-qwen3-30B-A3B-16xgpu.sh --dry-run --cluster '{"nodes": 2, "gpus_per_node": 8}'
# The old log-probs are the engines' (--use-rollout-logprobs: no ActorFwd role, whose 30B copy would
# need GPUs of its own), corrected by --use-tis. EXP_DIR (default /root) must be on a filesystem both
# nodes mount. Environment: EXP_DIR, MODEL_DIR, DATA_DIR (default EXP_DIR), NUM_ROLLOUT (200).
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/qwen3-30B-A3B.sh"

EXP_DIR="${EXP_DIR:-/root}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-200}"

python3 relax/entrypoints/train.py \
  --fully-async --max-staleness 2 --use-tis --use-rollout-logprobs \
  --resource '{"actor": [1, 8], "rollout": [1, 8], "advantages": [1, 0]}' \
  --exp-dir "${EXP_DIR}/runs/qwen3-30B-A3B-async" \
  "${MODEL_ARGS[@]}" \
  --hf-checkpoint "${MODEL_DIR}/Qwen3-30B-A3B" --ref-load "${MODEL_DIR}/Qwen3-30B-A3B" \
  --save "${EXP_DIR}/ckpt/qwen3-30B-A3B-async" --save-interval 20 \
  --prompt-data "${DATA_DIR}/dapo-math-17k/dapo-math-17k.jsonl" --input-key prompt --label-key label \
  --apply-chat-template --rollout-shuffle --rm-type dapo \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 \
  --rollout-max-response-len 8192 --rollout-temperature 1.0 \
  --advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28 --entropy-coef 0 \
  --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 \
  --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 8 \
  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
  --use-dynamic-batch-size --max-tokens-per-gpu 8192 \
  --rollout-num-gpus-per-engine 2 --bf16 \
  --use-tensorboard --tb-experiment-name qwen3-30B-A3B-async "$@"
