#!/bin/bash
# CPU audio example: GRPO on a tiny Qwen3-Omni thinker that learns to hear pitch ("is the second tone higher?").
#
#   bash scripts/training/multimodal/run-tiny-audio-cpu.sh [EXTRA RELAX FLAGS...]
#
# 1. examples/tiny_audio/prepare.py builds the tokenizer, a tiny Qwen3-Omni thinker (audio encoder included,
#    random init), the task's rows (two-tone clips inline as WAV data URIs) and a weak SFT warm start.
# 2. Colocate GRPO: 2 hf engines take the clips as SGLang's audio_data, 1 FSDP worker trains the
#    whole model (audio encoder too) on the rows' input_features; the built-in math reward on \boxed{}.
# 3. Prints `eval accuracy: before=<x> after=<y>` on held-out clips (chance is 0.5).
# Environment overrides: EXP_DIR (default outputs/tiny-audio-cpu), MODEL_DIR, NUM_ROLLOUT, EVAL_INTERVAL,
# SEED, PREPARE_ARGS (extra flags for examples/tiny_audio/prepare.py). Arguments after the script
# name are appended to the train.py flags (later flags win).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../entrypoint/local.sh"
fi

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/tiny-audio-cpu}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-60}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
SEED="${SEED:-1234}"
RUN_DIR="${EXP_DIR}/run"

# shellcheck disable=SC2086  # PREPARE_ARGS is a list of extra flags for prepare.py
python3 -m examples.tiny_audio.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}" ${PREPARE_ARGS:-}

ARGS=(
  --colocate --resource '{"actor": [1, 1], "rollout": [1, 2]}'
  --exp-dir "${RUN_DIR}"
  --hf-checkpoint "${MODEL_DIR}/models/tiny-omni-sft"
  # data: the audio column, its placeholder in the prompt, the chat template
  --prompt-data "${MODEL_DIR}/data/train.jsonl"
  --input-key prompt --label-key label --apply-chat-template
  --multimodal-keys '{"audio": "audio"}'
  --rm-type math
  --rollout-shuffle --rollout-seed "${SEED}"
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size 32 --n-samples-per-prompt 8
  --rollout-max-response-len 8 --rollout-temperature 1.0
  --global-batch-size 256
  --advantage-estimator grpo --eps-clip 0.2 --entropy-coef 0
  --optimizer adam --lr 1e-3 --lr-warmup-iters 3 --lr-decay-style constant --weight-decay 0.0
  --clip-grad 1.0 --seed "${SEED}"
  --use-dynamic-batch-size --max-tokens-per-gpu 8192
  --use-tensorboard --tb-experiment-name tiny-audio-cpu
)
if [ "${EVAL_INTERVAL}" != "0" ]; then
  ARGS+=(--eval-interval "${EVAL_INTERVAL}" --eval-prompt-data heldout "${MODEL_DIR}/data/eval.jsonl"
         --n-samples-per-eval-prompt 1 --eval-temperature 1.0)
fi

python3 relax/entrypoints/train.py "${ARGS[@]}" "$@"

DRY_RUN=0
for arg in "$@"; do [ "${arg}" = "--dry-run" ] && DRY_RUN=1; done
if [ "${EVAL_INTERVAL}" != "0" ] && [ "${DRY_RUN}" = "0" ]; then
  python3 - "${RUN_DIR}/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["heldout"]
print(f"eval accuracy: before={s['before']:.3f} after={s['after']:.3f}")
PY
fi
