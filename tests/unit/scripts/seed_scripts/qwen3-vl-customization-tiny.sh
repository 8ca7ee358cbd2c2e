#!/bin/bash
# The customization guide's Qwen3-VL training script ("Training Script and Key Parameters":
# scripts/training/multimodal/run-qwen3-vl-4B-8xgpu.sh, given there as fragments), put together as
# written, with its placeholders filled for a tiny Qwen3-VL on a CPU machine. Tested by
# tests/unit/scripts/test_seed_scripts.py (--dry-run, fsdp and megatron backends).
#
#   bash tests/unit/scripts/seed_scripts/qwen3-vl-customization-tiny.sh [EXTRA RELAX FLAGS...]
#   bash tests/unit/scripts/seed_scripts/qwen3-vl-customization-tiny.sh --train-backend megatron --dry-run
#
# Model preparation (the guide downloads Qwen3-VL-4B-Instruct and multimodal-open-r1-8k-verified):
# examples/tiny_vision/prepare.py --kind qwen3_vl builds a tiny Qwen3-VL and its image rows under
# MODEL_DIR when they are missing; with --dry-run only their config.json and a sample of rows
# (no weights, no SFT).
#
# Placeholders filled (the guide's value -> this script's):
#   source qwen3-vl-4B.sh -> tiny-qwen3.sh (empty MODEL_ARGS: both backends read the tiny model's config.json;
#       the 4B flags would contradict it)
#   ${MODEL_DIR}/Qwen3-VL-4B-Instruct/ -> ${MODEL_DIR}/models/tiny-vl-sft/ (tiny-vl-plan/ under --dry-run)
#   ${PROMPT_SET} -> ${DATA_DIR}/data/train.jsonl; aime /root/aime-2024/aime-2024.jsonl ->
#       heldout ${DATA_DIR}/data/eval.jsonl; /path/checkpoint/ -> ${EXP_DIR}/checkpoint/;
#       --dump-details /path -> ${EXP_DIR}/dump; ${NUM_ROLLOUT}, ${PROJECT_NAME}, ${SYSTEM_PROMPT}: env, below
#   GPU counts: --resource actor/rollout [1, 8] -> [1, 1]; --tensor-model-parallel-size 2 -> 1;
#       --expert-model-parallel-size 8 -> 1; --rollout-num-gpus-per-engine 2 -> 1
#   sizes: --eval-max-response-len 16384 -> 64 (the tiny model has 1024 positions)
# Deviations from the guide's text:
#   - `ray job submit --address=http://127.0.0.1:8265 -- python3 relax/entrypoints/train.py` -> plain
#     `python3 relax/entrypoints/train.py` (it starts a private Ray; `bash scripts/entrypoint/local.sh
#     <this script>` runs it against a Ray node of its own, as the guide's Ray job would)
#   - --megatron-to-hf-mode bridge is kept and overridden by --megatron-to-hf-mode raw (TINY_OVERRIDES
#     below): bridge needs megatron-bridge, which needs transformers < 5 and Transformer Engine, both
#     excluded by this project's pins; raw is this build's HF<->Megatron conversion
#   - --system-prompt "${SYSTEM_PROMPT}" is quoted (the guide's unquoted expansion splits a prompt with spaces)
#   - arguments after the script name are appended to train.py's flags (later flags win): how a
#     backend (--train-backend fsdp|megatron) or --dry-run is chosen
# Environment: EXP_DIR (default outputs/seed-qwen3-vl-tiny), MODEL_DIR, DATA_DIR (default EXP_DIR),
# NUM_ROLLOUT (3), PROJECT_NAME, SYSTEM_PROMPT.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../../../scripts/entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/seed-qwen3-vl-tiny}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-3}"
PROJECT_NAME="${PROJECT_NAME:-Relax/dev/qwen3-vl-tiny}"
SYSTEM_PROMPT="${SYSTEM_PROMPT:-You are a helpful assistant. Look at the image before you answer.}"
PROMPT_SET="${DATA_DIR}/data/train.jsonl"

#=============================================================================
# Tiny model preparation (not in the guide: it downloads the model and the data)
#=============================================================================
DRY_RUN=0
for arg in "$@"; do [ "${arg}" = "--dry-run" ] && DRY_RUN=1; done
MODEL_PATH="${MODEL_DIR}/models/tiny-vl-sft"
if [ ! -f "${MODEL_PATH}/config.json" ]; then
  if [ "${DRY_RUN}" = "1" ]; then
    MODEL_PATH="${MODEL_DIR}/models/tiny-vl-plan"
    if [ ! -f "${MODEL_PATH}/config.json" ]; then
      python3 -m examples.tiny_vision.prepare --out-dir "${MODEL_DIR}" --kind qwen3_vl --plan-only
    fi
  else
    python3 -m examples.tiny_vision.prepare --out-dir "${MODEL_DIR}" --kind qwen3_vl
  fi
fi
if [ "${DATA_DIR}" != "${MODEL_DIR}" ] && [ ! -f "${PROMPT_SET}" ]; then
  mkdir -p "${DATA_DIR}/data" && cp "${MODEL_DIR}"/data/*.jsonl "${DATA_DIR}/data/"
fi

#=============================================================================
# The guide's flags
#=============================================================================
CKPT_ARGS=(
  # Used to load tokenizer and other info; model weights from this HF path are not actually used
  --hf-checkpoint "${MODEL_PATH}/"
  # Reference model checkpoint
  # When --load is not set, this will be used as the initial checkpoint for training
  --ref-load "${MODEL_PATH}/"
  # Enable megatron bridge automatic weight conversion
  --megatron-to-hf-mode bridge
  # Actor model load path. If empty or no valid checkpoint exists, loads from --ref-load
  # For resuming training, point this to the checkpoint path
  --load "${EXP_DIR}/checkpoint/"
  # Save path for model during training
  --save "${EXP_DIR}/checkpoint/"
  # Model save interval (in steps)
  --save-interval 20
)

ROLLOUT_ARGS=(
  # Dataset path
  --prompt-data "${PROMPT_SET}"
  # Number of prompts to sample per round
  --rollout-batch-size 32
  # Number of responses to generate per prompt
  # Multiplied with --rollout-batch-size to determine total samples per round
  --n-samples-per-prompt 8
  # Number of samples required for one parameter update (optimizer.step)
  --global-batch-size 256
  # Total number of "sample → train" loop iterations
  --num-rollout "${NUM_ROLLOUT}"
  # Dataset input key
  --input-key prompt
  # Dataset label key
  --label-key label
  # Apply Chat Template if the prompt's input_key is in OpenAI message format
  --apply-chat-template
  # Reward computation method; this option only supports built-in reward methods
  # For custom reward, use --custom-rm-path
  --rm-type openr1mm
  # Multimodal data extraction keys
  --multimodal-keys '{"image":"image"}'
  # Custom SYSTEM_PROMPT; inserts a new message at the head of the prompt
  --system-prompt "${SYSTEM_PROMPT}"
)

VAL_ARGS=(
  # Evaluation interval (in rollout count)
  --eval-interval 5
  # Evaluation prompt dataset
  --eval-prompt-data heldout "${DATA_DIR}/data/eval.jsonl"
  # Number of samples per evaluation prompt
  --n-samples-per-eval-prompt 16
  # Maximum response length during evaluation
  --eval-max-response-len 64
  # Sampling parameters during evaluation
  --eval-top-p 0.7
)

LOG_ARGS=(
  # Enable ClearML
  --use-clearml
  # Enable TensorBoard
  --use-tensorboard
  # Enable centralized metrics collection and reporting service
  --use-metrics-service
  # TensorBoard/ClearML storage path
  --tb-project-name "${PROJECT_NAME}"
  # TensorBoard/ClearML storage name
  --tb-experiment-name name
  # Dump per-step rollout and training details to a specified directory
  --dump-details "${EXP_DIR}/dump"
)

PERF_ARGS=(
  # Training parallelism
  --tensor-model-parallel-size 1
  --sequence-parallel
  --pipeline-model-parallel-size 1
  --expert-model-parallel-size 1
  # Recomputation
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  # CPU offload optimizer
  --optimizer-cpu-offload
  --overlap-cpu-optimizer-d2h-h2d
  --use-precision-aware-optimizer
  # Inference
  --rollout-num-gpus-per-engine 1  # sglang tp
  --sglang-mem-fraction-static 0.8
  # Enables dynamic batching. When enabled, --micro-batch-size is ignored.
  --use-dynamic-batch-size
  # Maximum number of tokens processed per GPU.
  --max-tokens-per-gpu 9216
)

#=============================================================================
# Tiny/CPU overrides of the guide's flags (later flags win; each is listed in the header)
#=============================================================================
TINY_OVERRIDES=(
  --megatron-to-hf-mode raw  # bridge: megatron-bridge needs transformers < 5 and Transformer Engine (excluded)
)

#=============================================================================
# Launch (the guide: ray job submit ... -- python3 relax/entrypoints/train.py)
#=============================================================================
# [1, 8] represent replica count and total GPU count respectively; set replicas to 1
# Resources are partitioned via _derive_cluster_args_from_resource
python3 relax/entrypoints/train.py \
  --resource '{"actor": [1, 1], "rollout": [1, 1]}' \
  --max-staleness 0 \
  --num-data-storage-units 1 \
  --colocate \
  "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${VAL_ARGS[@]}" "${LOG_ARGS[@]}" "${PERF_ARGS[@]}" \
  "${TINY_OVERRIDES[@]}" "$@"
