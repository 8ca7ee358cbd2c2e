#!/bin/bash
# CPU vision agentic example (DeepEyes in miniature): a tiny Qwen2.5-VL learns to zoom into its image
# before it answers (multi-turn GRPO; the tool's observation is an image crop).
#
#   bash scripts/training/agentic/run-tiny-deepeyes-cpu.sh [EXTRA RELAX FLAGS...]
#
# 1. examples/deepeyes/prepare.py builds a tiny Qwen2.5-VL whose processor shows an image at 4 vision
#    tokens, images whose four regions look grey at that size (each a fine checkerboard of a colour and
#    its mirror about grey), and a multi-turn SFT warm start: 30% of the demonstrations zoom into the
#    asked region (the `zoom` tool returns it at full resolution) and read its colour, the rest guess.
# 2. Colocate GRPO through the seeds' plugin layout: --custom-generate-function-path
#    examples.deepeyes.rollout.generate (the built-in multi-turn rollout) and --custom-config-path
#    examples/deepeyes/deepeyes_config.yaml (max_turns, rollout_interaction_env_path); each zoomed
#    image joins the sample's media (the engine's image_data, the trainer's pixel_values).
# 3. Prints `eval accuracy: before=<x> after=<y>` and the held-out tool-call rate before and after.
# Environment overrides: EXP_DIR (default outputs/tiny-deepeyes-cpu), MODEL_DIR, NUM_ROLLOUT, EVAL_INTERVAL,
# SEED, PREPARE_ARGS (extra flags for examples/deepeyes/prepare.py). Arguments after the script name are
# appended to the train.py flags (later flags win).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/tiny-deepeyes-cpu}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-40}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
SEED="${SEED:-1234}"
RUN_DIR="${EXP_DIR}/run"

# shellcheck disable=SC2086  # PREPARE_ARGS is a list of extra flags for prepare.py
python3 -m examples.deepeyes.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}" ${PREPARE_ARGS:-}

ARGS=(
  --colocate --resource '{"actor": [1, 1], "rollout": [1, 2]}'
  --exp-dir "${RUN_DIR}"
  --hf-checkpoint "${MODEL_DIR}/models/tiny-deepeyes-sft"
  --prompt-data "${MODEL_DIR}/data/train.jsonl"
  --input-key prompt --label-key label --metadata-key metadata --apply-chat-template
  --multimodal-keys '{"image": "image"}'
  # the seeds' agentic layout: the example's rollout.py and its config YAML
  --custom-generate-function-path examples.deepeyes.rollout.generate
  --custom-config-path "${RELAX_ROOT:-.}/examples/deepeyes/deepeyes_config.yaml"
  --log-multi-turn
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
  --use-tensorboard --tb-experiment-name tiny-deepeyes-cpu
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
