#!/bin/bash
# The verl-to-Relax migration guide's launch script (Step 5, "Relax pattern": the script with a
# MODE=sync|async switch), as written, with its placeholders filled for this repository's gsm8k
# recipe (<algo> = gsm8k) on a tiny Qwen3 (<model> = tiny-qwen3) on a CPU machine. Tested by
# tests/unit/scripts/test_seed_scripts.py (--dry-run; sync and async; fsdp and megatron backends).
#
# Usage: bash tests/unit/scripts/seed_scripts/verl-guide-launch-tiny.sh [sync|async] [EXTRA RELAX FLAGS...]
#
# Prerequisites (the guide: convert the data, set MODEL_DIR and DATA_DIR) are done here when missing:
# examples/tiny_math/prepare.py builds the tiny Qwen3 under MODEL_DIR (with --dry-run only its
# config.json: no weights, no SFT), examples/gsm8k/prepare_data.py writes gsm8k rows in verl format
# and converts them (scripts/tools/process_verl.py) under DATA_DIR.
#
# Placeholders filled (the guide's value -> this script's):
#   examples/<algo>/ -> tests/unit/scripts/seed_scripts/ (the relative path to scripts/entrypoint/local.sh)
#   <model>.sh -> tiny-qwen3.sh; ${MODEL_DIR}/<Model> -> ${MODEL_DIR}/models/tiny-qwen3-sft (tiny-qwen3-plan
#       under --dry-run); <algo> -> gsm8k; ${PROMPT_SET} -> ${DATA_DIR}/gsm8k/train.parquet;
#       <name> ${TEST_FILES} -> gsm8k ${DATA_DIR}/gsm8k/test.parquet; logs/ -> ${EXP_DIR}/logs/
#   GPU counts: sync --resource actor/rollout [1, 8] -> [1, 1]; async actor 4 / rollout 2 / reference 1 /
#       actor_fwd 1 -> 1 / 1 / 1 / 1; --tensor-model-parallel-size 4 -> 1; --rollout-num-gpus-per-engine 2 -> 1
#   sizes: --rollout-max-response-len 1024 -> 24, --rollout-max-prompt-len 512 -> 200 (the tiny model has
#       256 positions)
# Deviations from the guide's text:
#   - --multimodal-keys '{"image":"image"}' stays commented out: the guide says to omit it for
#     text-only data, and gsm8k is text-only
#   - --megatron-to-hf-mode bridge is kept and overridden by --megatron-to-hf-mode raw (TINY_OVERRIDES
#     below): bridge needs megatron-bridge, which needs transformers < 5 and Transformer Engine, both
#     excluded by this project's pins; raw is this build's HF<->Megatron conversion
#   - arguments after the mode are appended to train.py's flags (later flags win): how a backend
#     (--train-backend fsdp|megatron) or --dry-run is chosen
#   - as in the guide, EVAL_ARGS is defined and not passed to the launch, so no eval runs
# Environment: MODE, EXP_DIR (default outputs/seed-verl-guide-tiny), MODEL_DIR, DATA_DIR (default
# EXP_DIR), NUM_ROLLOUT (3), PROJECT_NAME.
set -ex
set -o pipefail

MODE_ENV="${MODE:-sync}"
MODE=${1:-${MODE:-"sync"}} # Arg $1 > env $MODE > default "sync"
# (tiny) the mode argument is taken off the arguments passed on to train.py; a flag is not a mode
case "${MODE}" in sync|async) [ "${1:-}" != "${MODE}" ] || shift ;; *) MODE="${MODE_ENV}" ;; esac
TIMESTAMP=$(date "+%Y-%m-%d-%H:%M:%S")
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"

# Auto-source local environment when not launched via an external entrypoint.
# local.sh sets MODEL_CONFIG_DIR, RUNTIME_ENV_JSON, PYTHONPATH, and starts Ray.
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../../../scripts/entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"

PROJECT_NAME="${PROJECT_NAME:=Relax/dev/gsm8k}"
EXP_NAME="tiny-qwen3-gsm8k-fully-${MODE}-${TIMESTAMP}"

#=============================================================================
# Tiny model and data (the guide's prerequisites; not in its script)
#=============================================================================
EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/seed-verl-guide-tiny}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-3}"
DRY_RUN=0
for arg in "$@"; do [ "${arg}" = "--dry-run" ] && DRY_RUN=1; done
MODEL_PATH="${MODEL_DIR}/models/tiny-qwen3-sft"
if [ ! -f "${MODEL_PATH}/config.json" ]; then
  if [ "${DRY_RUN}" = "1" ]; then
    MODEL_PATH="${MODEL_DIR}/models/tiny-qwen3-plan"
    if [ ! -f "${MODEL_PATH}/config.json" ]; then
      python3 -m examples.tiny_math.prepare --out-dir "${MODEL_DIR}" --plan-only
    fi
  else
    python3 -m examples.tiny_math.prepare --out-dir "${MODEL_DIR}"
  fi
fi
PROMPT_SET="${DATA_DIR}/gsm8k/train.parquet"
TEST_FILES="${DATA_DIR}/gsm8k/test.parquet"
if [ ! -f "${PROMPT_SET}" ]; then
  python3 -m examples.gsm8k.prepare_data --out-dir "${DATA_DIR}"
fi

CKPT_ARGS=(
  --hf-checkpoint ${MODEL_PATH}
  --ref-load ${MODEL_PATH}
  # --load ${MODEL_DIR}/<Model>_mcore/ # for resuming
  # --save ${MODEL_DIR}/<Model>_mcore/
  # --save-interval 4
  --megatron-to-hf-mode bridge
)

ROLLOUT_ARGS=(
  --prompt-data "${PROMPT_SET}"
  --input-key prompt
  --label-key label
  --metadata-key extra_info
  # --multimodal-keys '{"image":"image"}' # if multimodal; omit for text-only
  --reward-key score
  --apply-chat-template
  --custom-rm-path examples.gsm8k.reward_gsm8k.reward_func
  --num-rollout ${NUM_ROLLOUT}
  --rollout-batch-size 32
  --n-samples-per-prompt 8
  --rollout-max-response-len 24
  --rollout-max-prompt-len 200
  --rollout-temperature 1
  # global-batch-size MUST equal rollout-batch-size × n-samples-per-prompt
  --global-batch-size 256
  --rollout-shuffle
  --use-fault-tolerance
)

PERF_ARGS=(
  --tensor-model-parallel-size 1 # TP × PP must divide actor GPU count
  --sequence-parallel
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --expert-model-parallel-size 1
  --expert-tensor-parallel-size 1
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  --micro-batch-size 1
  --max-tokens-per-gpu 9216 # dynamic batch memory cap
)

GRPO_ARGS=(
  --advantage-estimator grpo
  --use-kl-loss
  --kl-loss-coef 0.001
  --kl-loss-type low_var_kl
  --entropy-coef 0
  --eps-clip 0.2
  --eps-clip-high 0.28
  --use-tis
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr 1e-6
  --lr-decay-style constant
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.98
  --clip-grad 1.0
  --optimizer-cpu-offload
  --overlap-cpu-optimizer-d2h-h2d
  --use-precision-aware-optimizer
)

SGLANG_ARGS=(
  --rollout-num-gpus-per-engine 1
  --sglang-mem-fraction-static 0.8
)

LOG_ARGS=(
  --use-tensorboard
  --use-metrics-service
  --tb-project-name ${PROJECT_NAME}
  --tb-experiment-name ${EXP_NAME}
)

MISC_ARGS=(
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --accumulate-allreduce-grads-in-fp32
  --attention-softmax-in-fp32
  --attention-backend flash
)

EVAL_ARGS=(
  --eval-interval 100
  --eval-prompt-data gsm8k ${TEST_FILES}
)

#=============================================================================
# Tiny/CPU overrides of the guide's flags (later flags win; each is listed in the header)
#=============================================================================
TINY_OVERRIDES=(
  --megatron-to-hf-mode raw  # bridge: megatron-bridge needs transformers < 5 and Transformer Engine (excluded)
)

#=============================================================================
# Launch: fully async or colocate (sync)
#=============================================================================
mkdir -p "${EXP_DIR}/logs"
if [ "${MODE}" = "async" ]; then
  # Fully Async: actor/rollout/reference/actor_fwd/advantages on separate GPUs.
  # 8 GPU example: actor=4, rollout=2, reference=1, actor_fwd=1, advantages=CPU
  python3 relax/entrypoints/train.py \
    --resource '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1], "actor_fwd": [1, 1], "advantages": [1, 0]}' \
    --max-staleness 3 \
    --num-data-storage-units 1 \
    --num-iters-per-train-update 8 \
    --ref-actor-config '{"tensor_model_parallel_size": 1, "max_tokens_per_gpu": 16384, "sequence_parallel": false, "only_load_weight": true}' \
    --fully-async \
    --use-health-check \
    "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" \
    "${OPTIMIZER_ARGS[@]}" "${GRPO_ARGS[@]}" "${LOG_ARGS[@]}" \
    "${PERF_ARGS[@]}" "${SGLANG_ARGS[@]}" "${MISC_ARGS[@]}" \
    "${TINY_OVERRIDES[@]}" "$@" \
    2>&1 | tee "${EXP_DIR}/logs/${EXP_NAME}.log"
else
  # Colocate (sync): actor and rollout share the same GPUs.
  python3 relax/entrypoints/train.py \
    --resource '{"actor": [1, 1], "rollout": [1, 1]}' \
    --max-staleness 1 \
    --num-data-storage-units 1 \
    --colocate \
    --use-health-check \
    --balance-data \
    "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" \
    "${OPTIMIZER_ARGS[@]}" "${GRPO_ARGS[@]}" "${LOG_ARGS[@]}" \
    "${PERF_ARGS[@]}" "${SGLANG_ARGS[@]}" "${MISC_ARGS[@]}" \
    "${TINY_OVERRIDES[@]}" "$@" \
    2>&1 | tee "${EXP_DIR}/logs/${EXP_NAME}.log"
fi
