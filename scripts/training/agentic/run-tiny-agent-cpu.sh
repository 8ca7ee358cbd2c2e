#!/bin/bash
# CPU agentic example: a tiny Qwen3 learns to call a lookup tool before it answers (multi-turn GRPO).
#
#   bash scripts/training/agentic/run-tiny-agent-cpu.sh [EXTRA RELAX FLAGS...]
#
# 1. examples/tiny_agent/prepare.py builds a tokenizer with Qwen2.5's tool-call chat template, a tiny
#    Qwen3, rows whose answer (a price) only the `lookup` tool knows, and a multi-turn SFT warm start
#    from demonstrations: 30% call the tool and read its answer, the rest guess.
# 2. Colocate GRPO with the built-in multi-turn rollout (--rollout-interaction-env-path
#    examples.tiny_agent.env_lookup): model turn, tool observation (loss mask 0), model turn; the
#    built-in math reward on the final \boxed{}; trajectories logged (--log-multi-turn).
# 3. Prints `eval accuracy: before=<x> after=<y>` and the held-out tool-call rate before and after.
# Environment overrides: EXP_DIR (default outputs/tiny-agent-cpu), MODEL_DIR, NUM_ROLLOUT, EVAL_INTERVAL, SEED,
# PREPARE_ARGS (extra flags for examples/tiny_agent/prepare.py). Arguments after the script name are
# appended to the train.py flags (later flags win).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/tiny-agent-cpu}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-40}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
SEED="${SEED:-1234}"
RUN_DIR="${EXP_DIR}/run"

# shellcheck disable=SC2086  # PREPARE_ARGS is a list of extra flags for prepare.py
python3 -m examples.tiny_agent.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}" ${PREPARE_ARGS:-}

ARGS=(
  --colocate --resource '{"actor": [1, 1], "rollout": [1, 2]}'
  --exp-dir "${RUN_DIR}"
  "${MODEL_ARGS[@]}"
  --hf-checkpoint "${MODEL_DIR}/models/tiny-agent-sft"
  # data: messages through the chat template; the row's price list reaches the environment as metadata
  --prompt-data "${MODEL_DIR}/data/train.jsonl"
  --input-key prompt --label-key label --metadata-key metadata --apply-chat-template
  # the multi-turn rollout: an environment per sample, at most 3 model turns
  --rollout-interaction-env-path examples.tiny_agent.env_lookup --max-turns 3 --log-multi-turn
  --rm-type math
  --rollout-shuffle --rollout-seed "${SEED}"
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size 32 --n-samples-per-prompt 8
  --rollout-max-response-len 32 --rollout-temperature 1.0
  --global-batch-size 256
  --advantage-estimator grpo --eps-clip 0.2 --entropy-coef 0
  --optimizer adam --lr 1e-3 --lr-warmup-iters 3 --lr-decay-style constant --weight-decay 0.0
  --clip-grad 1.0 --seed "${SEED}"
  --use-dynamic-batch-size --max-tokens-per-gpu 8192
  --use-tensorboard --tb-experiment-name tiny-agent-cpu
)
if [ "${EVAL_INTERVAL}" != "0" ]; then
  ARGS+=(--eval-interval "${EVAL_INTERVAL}" --eval-prompt-data heldout "${MODEL_DIR}/data/eval.jsonl"
         --n-samples-per-eval-prompt 1 --eval-temperature 1.0)
fi

python3 relax/entrypoints/train.py "${ARGS[@]}" "$@"

DRY_RUN=0
for arg in "$@"; do [ "${arg}" = "--dry-run" ] && DRY_RUN=1; done
if [ "${EVAL_INTERVAL}" != "0" ] && [ "${DRY_RUN}" = "0" ]; then
  python3 "${SCRIPT_DIR}/summary.py" "${RUN_DIR}"
fi
