#!/bin/bash
# CPU black-box agent example: the tiny_agent task (a lookup tool over a per-row price list) played by an
# agent written with the plain `openai` client, trained through the agent gateway (multi-turn GRPO).
#
#   bash scripts/training/agentic/run-blackbox-agent-cpu.sh [EXTRA RELAX FLAGS...]
#
# 1. examples/tiny_agent/prepare.py builds the tokenizer (Qwen2.5's tool-call chat template), the tiny
#    Qwen3, the rows and the multi-turn SFT warm start exactly as run-tiny-agent-cpu.sh does (the same
#    model: MODEL_DIR=outputs/tiny-agent-cpu reuses it). That warm start knows its tool from the system
#    message, so the gateway declares the agent's `tools=[lookup]` without rendering their schema into the
#    prompt (--agent-tools-in-prompt false): calls are still parsed into OpenAI `tool_calls`.
# 2. Colocate GRPO where every sample is an episode of examples/tiny_agent/blackbox_agent.py
#    (--agent-function-path): the agent calls http://127.0.0.1:<port>/sessions/<id>/v1/chat/completions
#    with the session's key, runs the lookup itself and calls again; the gateway records each call's
#    token ids, log-probs and weight version (token-in/token-out). The built-in math reward on the final
#    \boxed{}; trajectories logged (--log-multi-turn).
# 3. Prints `eval accuracy: before=<x> after=<y>` and the held-out tool-call rate before and after.
# Environment overrides: EXP_DIR (default outputs/blackbox-agent-cpu), MODEL_DIR, NUM_ROLLOUT, EVAL_INTERVAL,
# SEED, PREPARE_ARGS (extra flags for examples/tiny_agent/prepare.py). Arguments after the script name are
# appended to the train.py flags (later flags win).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/blackbox-agent-cpu}"
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
  # data: the rows' messages go to the agent as they are (no --apply-chat-template: the gateway renders
  # what the agent sends); the row's price list reaches the agent as metadata
  --prompt-data "${MODEL_DIR}/data/train.jsonl"
  --input-key prompt --label-key label --metadata-key metadata
  # the black-box agent: one gateway session per sample, at most 60 s per episode
  --agent-function-path examples.tiny_agent.blackbox_agent.run_episode --agent-timeout 60 --log-multi-turn
  --agent-tools-in-prompt false
  --rm-type math
  --rollout-shuffle --rollout-seed "${SEED}"
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size 32 --n-samples-per-prompt 8
  --rollout-max-response-len 32 --rollout-temperature 1.0
  --global-batch-size 256
  --advantage-estimator grpo --eps-clip 0.2 --entropy-coef 0
  # lr half run-tiny-agent-cpu.sh's: at 1e-3 this task sits at the edge of stability (docs/agents.md)
  --optimizer adam --lr 5e-4 --lr-warmup-iters 3 --lr-decay-style constant --weight-decay 0.0
  --clip-grad 1.0 --seed "${SEED}"
  --use-dynamic-batch-size --max-tokens-per-gpu 8192
  --use-tensorboard --tb-experiment-name blackbox-agent-cpu
)
if [ "${EVAL_INTERVAL}" != "0" ]; then
  ARGS+=(--eval-interval "${EVAL_INTERVAL}" --eval-prompt-data heldout "${MODEL_DIR}/data/eval.jsonl"
         --n-samples-per-eval-prompt 1 --eval-temperature 1.0)
fi

START=$(date +%s)
python3 relax/entrypoints/train.py "${ARGS[@]}" "$@"

DRY_RUN=0
for arg in "$@"; do [ "${arg}" = "--dry-run" ] && DRY_RUN=1; done
if [ "${EVAL_INTERVAL}" != "0" ] && [ "${DRY_RUN}" = "0" ]; then
  python3 "${SCRIPT_DIR}/summary.py" "${RUN_DIR}"
  echo "training wall time: $(( $(date +%s) - START )) s (after prepare)"
fi
