#!/bin/bash
# CPU quickstart: GRPO (or another estimator) on a tiny Qwen3 that visibly learns, in about 5 minutes on 2 cores.
#
#   bash scripts/training/text/run-tiny-cpu.sh [EXTRA RELAX FLAGS...]
#   ESTIMATOR=ppo bash scripts/training/text/run-tiny-cpu.sh     # PPO with a critic instead of GRPO
#
# 1. examples/tiny_math/prepare.py builds the tokenizer, a tiny Qwen3, the task data and a short
#    SFT warm start (cached in ${MODEL_DIR} / ${DATA_DIR}; no model hub involved).
# 2. Colocate GRPO: 2 hf engines + 1 FSDP worker, the built-in math reward on \boxed{} answers.
# 3. Prints `eval accuracy: before=<x> after=<y>` on held-out prompts.
# Environment overrides: MODE (colocate | async; run-tiny-cpu-async.sh sets async),
# MAX_STALENESS (async only, default 2), EXP_DIR (default outputs/tiny-cpu), MODEL_DIR, DATA_DIR (default EXP_DIR),
# NUM_ROLLOUT, EVAL_INTERVAL (0 = no eval), SAVE_INTERVAL (0 = no checkpoints), SEED,
# PREPARE_ARGS (extra flags for examples/tiny_math/prepare.py, e.g. "--hidden-size 128"),
# ESTIMATOR (--advantage-estimator: grpo (default), gspo, sapo, reinforce_plus_plus,
# reinforce_plus_plus_baseline, ppo), KILL_ENGINE_AT_STEP (fault-tolerance demo: engine 0 is killed
# with SIGKILL mid-rollout at that step, --use-fault-tolerance replaces it; FAULT_SIGNAL=STOP hangs it
# instead; docs/operations.md "Health checks and recovery"). Arguments after the script name are appended to the
# train.py flags (later flags win), e.g. `... run-tiny-cpu.sh --lr 5e-4`.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/tiny-cpu}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
DATA_DIR="${DATA_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-80}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
SAVE_INTERVAL="${SAVE_INTERVAL:-40}"
SEED="${SEED:-1234}"
ESTIMATOR="${ESTIMATOR:-grpo}"
RUN_DIR="${EXP_DIR}/run"
MODE="${MODE:-colocate}"
# `--lora-rank N` among the extra flags (docs/lora.md): the actor trains LoRA adapters only, and scores
# the KL Reference itself (its base model with the adapter off), so no Reference role is deployed.
LORA_RANK=0
PREV_ARG=""
for arg in "$@"; do
  [ "${PREV_ARG}" = "--lora-rank" ] && LORA_RANK="${arg}"
  case "${arg}" in --lora-rank=*) LORA_RANK="${arg#*=}" ;; esac
  PREV_ARG="${arg}"
done

case "${MODE}" in
  colocate)
    # Phases take turns on both cores: 2 engines generate, then the trainer ranks run.
    MODE_ARGS=(--colocate)
    RESOURCE='{"actor": [1, 1], "rollout": [1, 2], "reference": [1, 1]}'
    if [ "${KL_LOSS_COEF:-0.05}" = "0" ] || [ "${LORA_RANK}" != "0" ]; then
      RESOURCE='{"actor": [1, 1], "rollout": [1, 2]}'
    fi ;;
  async)
    # Roles run at once: 1 engine keeps generating while Actor, ActorFwd, Reference and
    # Advantages train and score behind it, at most MAX_STALENESS steps behind the rollout.
    # --use-tis weighs each token by how much likelier the trainer's old policy makes it than the
    # engine did: where the engine runs far ahead (a GPU), samples are up to MAX_STALENESS
    # versions old and, at this learning rate, the policy collapses without it.
    MODE_ARGS=(--fully-async --max-staleness "${MAX_STALENESS:-2}" --use-tis)
    RESOURCE='{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1], "actor_fwd": [1, 1], "advantages": [1, 0]}' ;;
  *) echo "MODE must be colocate or async, got '${MODE}'" >&2; exit 2 ;;
esac

DRY_RUN=0
for arg in "$@"; do [ "${arg}" = "--dry-run" ] && DRY_RUN=1; done
MODEL_PATH="${MODEL_DIR}/models/tiny-qwen3-sft"
# shellcheck disable=SC2086  # PREPARE_ARGS is a list of extra flags for prepare.py
if [ "${DRY_RUN}" = "1" ] && [ ! -f "${MODEL_PATH}/prepare.json" ]; then
  # --dry-run before the model exists: the data and the model's config.json only (seconds, no SFT)
  python3 -m examples.tiny_math.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}" ${PREPARE_ARGS:-} --plan-only
  MODEL_PATH="${MODEL_DIR}/models/tiny-qwen3-plan"
else
  python3 -m examples.tiny_math.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}" ${PREPARE_ARGS:-}
fi
if [ "${DATA_DIR}" != "${MODEL_DIR}" ]; then
  mkdir -p "${DATA_DIR}/data" && cp -n "${MODEL_DIR}"/data/*.jsonl "${DATA_DIR}/data/"
fi

CKPT_ARGS=(
  --hf-checkpoint "${MODEL_PATH}"
  --ref-load "${MODEL_PATH}"
  --save-hf "${EXP_DIR}/hf"
)
if [ "${SAVE_INTERVAL}" != "0" ]; then
  CKPT_ARGS+=(--save "${EXP_DIR}/ckpt" --save-interval "${SAVE_INTERVAL}")
fi

ROLLOUT_ARGS=(
  --prompt-data "${DATA_DIR}/data/train.jsonl"
  --input-key prompt
  --label-key label
  --apply-chat-template
  --rm-type math
  --rollout-shuffle
  --rollout-seed "${SEED}"
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size 32
  --n-samples-per-prompt 8
  --rollout-max-response-len 16
  --rollout-temperature 1.0
  --global-batch-size 256
)

EVAL_ARGS=()
if [ "${EVAL_INTERVAL}" != "0" ]; then
  EVAL_ARGS=(
    --eval-interval "${EVAL_INTERVAL}"
    --eval-prompt-data heldout "${DATA_DIR}/data/eval.jsonl"
    --n-samples-per-eval-prompt 1
    --eval-temperature 1.0
  )
fi

ALGO_ARGS=(
  --advantage-estimator "${ESTIMATOR}"
  --eps-clip 0.2
  --entropy-coef 0
)
# A small KL to the SFT policy keeps the response format (eos) intact as accuracy climbs.
# KL_LOSS_COEF=0 drops it, and with it the Reference role (bench/step_overhead.py --shape lean).
if [ "${KL_LOSS_COEF:-0.05}" != "0" ]; then
  ALGO_ARGS+=(--use-kl-loss --kl-loss-coef "${KL_LOSS_COEF:-0.05}" --kl-loss-type low_var_kl)
fi
if [ "${ESTIMATOR}" = "ppo" ]; then
  # PPO: a critic (the policy's body + a value head) gives GAE advantages. Its value head starts
  # random, so it trains alone for a few steps before the policy moves.
  RESOURCE='{"actor": [1, 1], "rollout": [1, 2], "reference": [1, 1], "critic": [1, 1]}'
  ALGO_ARGS+=(
    --gamma 1.0
    --lambd 0.95
    --value-clip 0.2
    --critic-lr 1e-3
    --num-critic-only-steps 3
  )
fi

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr 1e-3
  --lr-warmup-iters 5
  --lr-decay-style constant
  --weight-decay 0.0
  --adam-beta1 0.9
  --adam-beta2 0.999
  --clip-grad 1.0
  --seed "${SEED}"
)

PERF_ARGS=(
  --use-dynamic-batch-size
  --max-tokens-per-gpu 8192
)

LOG_ARGS=(
  --use-tensorboard
  --tb-experiment-name tiny-cpu
)

FAULT_ARGS=()
INJECTOR_PID=""
if [ -n "${KILL_ENGINE_AT_STEP:-}" ]; then
  # Tier 1 on a live run: engine 0 gets the signal mid-rollout at that step; the HealthManager finds it
  # (health check every 5 s), replaces it and the run goes on (scripts/tools/inject_fault.py signals
  # only the engine logging to ${RUN_DIR}/engine_0.log).
  FAULT_ARGS=(--use-fault-tolerance --rollout-health-check-interval 5 --rollout-health-check-timeout 10)
  python3 "${SCRIPT_DIR}/../../tools/inject_fault.py" "${RUN_DIR}" --at-step "${KILL_ENGINE_AT_STEP}" \
    --signal "${FAULT_SIGNAL:-KILL}" &
  INJECTOR_PID=$!
  # Still waiting when the run ends (before that step, or failed): stop it (only this script's own child).
  trap 'kill "${INJECTOR_PID}" 2>/dev/null || true' EXIT
fi

python3 relax/entrypoints/train.py \
  "${MODE_ARGS[@]}" --resource "${RESOURCE}" \
  --exp-dir "${RUN_DIR}" \
  "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" \
  "${ALGO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${PERF_ARGS[@]}" "${LOG_ARGS[@]}" "${FAULT_ARGS[@]}" "$@"

if [ "${EVAL_INTERVAL}" != "0" ] && [ "${DRY_RUN}" = "0" ]; then
  python3 - "${RUN_DIR}/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["heldout"]
print(f"eval accuracy: before={s['before']:.3f} after={s['after']:.3f}")
PY
fi
