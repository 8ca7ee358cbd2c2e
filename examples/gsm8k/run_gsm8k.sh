#!/bin/bash
# GSM8K GRPO, migrated from verl's gsm8k recipe (docs/migrate-from-verl.md walks through it).
#
# Usage: bash examples/gsm8k/run_gsm8k.sh [sync|async] [EXTRA RELAX FLAGS...]
#   sync  (default): colocate GRPO; actor and rollout take turns on the same devices.
#   async          : the fully async pipeline (--fully-async, docs/fully-async.md): rollout runs up
#                    to 2 weight versions ahead while actor, actor_fwd, reference and advantages
#                    train and score behind it.
#   Flags after the mode are appended to train.py's (later flags win), e.g. `--train-backend megatron`;
#   `--dry-run` prints the plan and exits before Ray starts, building only the tiny model's
#   config.json when the model is missing (no tokenizer, no weights, no SFT).
#   Both modes on both backends are checked by tests/unit/scripts/test_seed_scripts.py (--dry-run).
#
# Prerequisites:
#   1. Data. verl-format gsm8k parquet (what verl's examples/data_preprocess/gsm8k.py writes) is not
#      read directly: convert it first (this script does it for you through prepare_data.py when
#      VERL_TRAIN_PARQUET is set):
#        python3 scripts/tools/process_verl.py --input-dir ~/data/gsm8k/train.parquet \
#            --output-dir ${DATA_DIR}/gsm8k/train.parquet
#      Without VERL_TRAIN_PARQUET, examples/gsm8k/prepare_data.py writes a small synthetic
#      gsm8k-style set in verl format and converts it, so the recipe runs offline.
#   2. Model. HF_CHECKPOINT=/path/to/hf/model (e.g. a Qwen2.5/Qwen3 instruct checkpoint). When it is
#      unset, the CPU quickstart's tiny Qwen3 is built under ${MODEL_DIR} (no model hub): it will not
#      learn gsm8k; the short default run shows the wiring (data -> rollout -> reward -> GRPO step).
#   3. Run: bash examples/gsm8k/run_gsm8k.sh            # on a GPU box also set NUM_GPUS, batch sizes
#
# Environment overrides: MODE, EXP_DIR (default outputs/gsm8k), MODEL_DIR and DATA_DIR (default EXP_DIR),
# HF_CHECKPOINT, VERL_TRAIN_PARQUET, VERL_TEST_PARQUET, NUM_GPUS (default 1: CPU worker processes on a
# CPU box), NUM_ROLLOUT (default 3), ROLLOUT_BATCH_SIZE (8), N_SAMPLES_PER_PROMPT (4),
# MAX_PROMPT_LEN (200), MAX_RESPONSE_LEN (24), EVAL_INTERVAL (default NUM_ROLLOUT; 0 = no eval), LR, SEED.
set -euo pipefail

MODE="${MODE:-sync}"  # arg $1 > env $MODE > default "sync"
case "${1:-}" in
  sync|async) MODE="$1"; shift ;;
  -*|"") ;;  # flags only: they go to train.py
  *) echo "run_gsm8k.sh: unknown mode '$1'; use sync or async" >&2; exit 2 ;;
esac
DRY_RUN=0
for arg in "$@"; do [ "${arg}" = "--dry-run" ] && DRY_RUN=1; done
TIMESTAMP=$(date "+%Y-%m-%d-%H-%M-%S")
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"

# local.sh sets MODEL_CONFIG_DIR and PYTHONPATH and cd's to the repo root (train.py starts Ray itself).
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../scripts/entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"  # MODEL_ARGS; a real model: source its scripts/models/<model>.sh

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/gsm8k}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
HF_CHECKPOINT="${HF_CHECKPOINT:-${MODEL_DIR}/models/tiny-qwen3-sft}"
NUM_GPUS="${NUM_GPUS:-1}"
NUM_ROLLOUT="${NUM_ROLLOUT:-3}"
ROLLOUT_BATCH_SIZE="${ROLLOUT_BATCH_SIZE:-8}"
N_SAMPLES_PER_PROMPT="${N_SAMPLES_PER_PROMPT:-4}"
MAX_PROMPT_LEN="${MAX_PROMPT_LEN:-200}"      # the tiny model has 256 positions; raise both for a real model
MAX_RESPONSE_LEN="${MAX_RESPONSE_LEN:-24}"
EVAL_INTERVAL="${EVAL_INTERVAL:-${NUM_ROLLOUT}}"
LR="${LR:-1e-6}"
SEED="${SEED:-1234}"
EXP_NAME="gsm8k-grpo-${MODE}-${TIMESTAMP}"
RUN_DIR="${EXP_DIR}/run-${MODE}"

#=============================================================================
# Model and data (both offline)
#=============================================================================
if [ ! -f "${HF_CHECKPOINT}/config.json" ]; then
  if [ "${HF_CHECKPOINT}" != "${MODEL_DIR}/models/tiny-qwen3-sft" ]; then
    echo "run_gsm8k.sh: HF_CHECKPOINT=${HF_CHECKPOINT} has no config.json; point it at an HF model directory" >&2
    exit 1
  fi
  if [ "${DRY_RUN}" = "1" ]; then
    # --dry-run before the model exists: its config.json only (seconds: no tokenizer, weights or SFT)
    HF_CHECKPOINT="${MODEL_DIR}/models/tiny-qwen3-plan"
    if [ ! -f "${HF_CHECKPOINT}/config.json" ]; then
      python3 -m examples.tiny_math.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}" --plan-only
    fi
  else
    python3 -m examples.tiny_math.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}"
  fi
fi

PREPARE_ARGS=(--out-dir "${DATA_DIR}" --seed "${SEED}")
if [ -n "${VERL_TRAIN_PARQUET:-}" ]; then
  PREPARE_ARGS+=(--verl-parquet "${VERL_TRAIN_PARQUET}")
  if [ -n "${VERL_TEST_PARQUET:-}" ]; then
    PREPARE_ARGS+=(--verl-test-parquet "${VERL_TEST_PARQUET}")
  fi
fi
python3 -m examples.gsm8k.prepare_data "${PREPARE_ARGS[@]}"
TRAIN_FILE="${DATA_DIR}/gsm8k/train.parquet"
TEST_FILE="${DATA_DIR}/gsm8k/test.parquet"

#=============================================================================
# Flags (verl key in the comment where there is one)
#=============================================================================
CKPT_ARGS=(
  --hf-checkpoint "${HF_CHECKPOINT}"  # actor_rollout_ref.model.path
  --ref-load "${HF_CHECKPOINT}"
  # --save "${EXP_DIR}/ckpt" --save-interval 20  # trainer.save_freq
)

ROLLOUT_ARGS=(
  --prompt-data "['${TRAIN_FILE}']"  # data.train_files
  --input-key prompt
  --label-key label                  # reward_model.ground_truth, flattened by process_verl.py
  --metadata-key extra_info          # extra_info (+ data_source, ability) -> sample.metadata
  --apply-chat-template
  --custom-rm-path examples.gsm8k.reward_gsm8k.reward_func  # custom_reward_function.path/name
  --reward-key score
  --custom-config-path "${SCRIPT_DIR}/gsm8k_config.yaml"    # custom_reward_function.reward_kwargs
  --rollout-shuffle
  --rollout-seed "${SEED}"
  --num-rollout "${NUM_ROLLOUT}"                # or --num-epoch N (trainer.total_epochs)
  --rollout-batch-size "${ROLLOUT_BATCH_SIZE}"
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}"       # actor_rollout_ref.rollout.n
  --rollout-max-prompt-len "${MAX_PROMPT_LEN}"           # data.max_prompt_length
  --rollout-max-response-len "${MAX_RESPONSE_LEN}"       # data.max_response_length
  --rollout-temperature 1.0                              # actor_rollout_ref.rollout.temperature
  # on-policy: global batch = rollout batch x samples per prompt (data.train_batch_size x n in verl)
  --global-batch-size "$((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT))"
)

EVAL_ARGS=()
if [ "${EVAL_INTERVAL}" != "0" ] && [ -f "${TEST_FILE}" ]; then
  EVAL_ARGS=(
    --eval-interval "${EVAL_INTERVAL}"           # trainer.test_freq
    --eval-prompt-data gsm8k "${TEST_FILE}"       # data.val_files
    --n-samples-per-eval-prompt 1
  )
fi

GRPO_ARGS=(
  --advantage-estimator grpo        # algorithm.adv_estimator=grpo
  --use-kl-loss                     # actor_rollout_ref.actor.use_kl_loss=True
  --kl-loss-coef 0.001              # actor_rollout_ref.actor.kl_loss_coef
  --kl-loss-type low_var_kl         # actor_rollout_ref.actor.kl_loss_type
  --entropy-coef 0                  # actor_rollout_ref.actor.entropy_coeff
  --eps-clip 0.2
  --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr "${LR}"                      # actor_rollout_ref.actor.optim.lr
  --lr-decay-style constant
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.98
  --clip-grad 1.0
  --seed "${SEED}"
  # With --train-backend megatron add: --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d
  #   --use-precision-aware-optimizer (Megatron options; the fsdp backend used on CPU has no use for them)
)

PERF_ARGS=(
  --use-dynamic-batch-size
  --max-tokens-per-gpu 8192
)

LOG_ARGS=(
  --use-tensorboard
  --tb-experiment-name "${EXP_NAME}"  # trainer.experiment_name
)

COMMON_ARGS=(
  --exp-dir "${RUN_DIR}"
  "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}"
  "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${PERF_ARGS[@]}" "${LOG_ARGS[@]}"
)

#=============================================================================
# Launch: fully async or colocate (sync)
#=============================================================================
mkdir -p "${EXP_DIR}/logs"
LOG_FILE="${EXP_DIR}/logs/${EXP_NAME}.log"
if [ "${MODE}" = "async" ]; then
  # Fully async: actor / rollout / reference / actor_fwd on separate devices, advantages on CPU.
  # 8-GPU example: NUM_GPUS=8 gives actor=4, rollout=2, reference=1, actor_fwd=1.
  python3 relax/entrypoints/train.py \
    --resource "{\"actor\": [1, $((NUM_GPUS / 2 > 0 ? NUM_GPUS / 2 : 1))], \"rollout\": [1, $((NUM_GPUS / 4 > 0 ? NUM_GPUS / 4 : 1))], \"reference\": [1, 1], \"actor_fwd\": [1, 1], \"advantages\": [1, 0]}" \
    --fully-async \
    --max-staleness 2 \
    --num-iters-per-train-update 4 \
    --ref-actor-config '{"tensor_model_parallel_size": 1, "only_load_weight": true}' \
    "${COMMON_ARGS[@]}" "$@" 2>&1 | tee "${LOG_FILE}"
elif [ "${MODE}" = "sync" ]; then
  # Colocate (sync): actor and rollout share the same NUM_GPUS devices (CPU processes on a CPU box);
  # trainer.n_gpus_per_node x trainer.nnodes in verl.
  python3 relax/entrypoints/train.py \
    --resource "{\"actor\": [1, ${NUM_GPUS}], \"rollout\": [1, ${NUM_GPUS}]}" \
    --colocate \
    "${COMMON_ARGS[@]}" "$@" 2>&1 | tee "${LOG_FILE}"
else
  echo "run_gsm8k.sh: unknown mode '${MODE}'; use sync or async" >&2
  exit 2
fi

if [ "${DRY_RUN}" = "0" ] && [ -n "${EVAL_ARGS[*]}" ] && [ -f "${RUN_DIR}/summary.json" ]; then
  python3 - "${RUN_DIR}/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["gsm8k"]
print(f"gsm8k eval accuracy: before={s['before']:.3f} after={s['after']:.3f}")
PY
fi
