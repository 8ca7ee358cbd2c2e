#!/bin/bash
# On-policy distillation on CPU: a 0.15 M-parameter student learns from a 4.3 M-parameter teacher.
#
#   bash examples/on_policy_distillation/run-tiny-opd-cpu.sh [EXTRA RELAX FLAGS...]
#   OPD_TYPE=megatron bash examples/on_policy_distillation/run-tiny-opd-cpu.sh   # teacher in the trainer
#
# 1. prepare.py builds both models on the tiny_math task (shared tokenizer; cached in MODEL_DIR).
# 2. Colocate GRPO on the math reward plus the OPD penalty -opd_kl_coef * (logp_student - logp_teacher)
#    per token. OPD_TYPE=sglang (default): the teacher runs on its own `hf` engine and scores the
#    student's samples over SGLang's /generate protocol; OPD_TYPE=megatron: the teacher is a
#    forward-only worker group of the training backend.
# 3. Prints the student's KL to the teacher at the first and last steps and the held-out accuracy.
# Environment overrides: EXP_DIR (default outputs/tiny-opd), MODEL_DIR (default EXP_DIR),
# NUM_ROLLOUT (default 40), OPD_TYPE, OPD_KL_COEF (default 1.0), SEED.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
if [ -z "${RELAX_ENTRYPOINT_MODE:-}" ]; then
  source "${SCRIPT_DIR}/../../scripts/entrypoint/local.sh"
fi
source "${MODEL_CONFIG_DIR}/tiny-qwen3.sh"

EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/tiny-opd}"
MODEL_DIR="${MODEL_DIR:-${EXP_DIR}}"
NUM_ROLLOUT="${NUM_ROLLOUT:-40}"
OPD_TYPE="${OPD_TYPE:-sglang}"
OPD_KL_COEF="${OPD_KL_COEF:-1.0}"
SEED="${SEED:-1234}"
RUN_DIR="${EXP_DIR}/run-${OPD_TYPE}-$(date +%Y%m%d-%H%M%S)"  # fresh per run: metrics.jsonl appends

python3 -m examples.on_policy_distillation.prepare --out-dir "${MODEL_DIR}" --seed "${SEED}"
STUDENT="${MODEL_DIR}/student/models/tiny-qwen3-sft"
TEACHER="${MODEL_DIR}/teacher/models/tiny-qwen3-sft"
DATA="${MODEL_DIR}/student/data"

python3 relax/entrypoints/train.py \
  --resource '{"actor": [1, 1], "rollout": [1, 1], "teacher": [1, 1]}' \
  --colocate \
  --exp-dir "${RUN_DIR}" \
  "${MODEL_ARGS[@]}" \
  --hf-checkpoint "${STUDENT}" \
  --use-opd --opd-type "${OPD_TYPE}" --opd-teacher-load "${TEACHER}" --opd-kl-coef "${OPD_KL_COEF}" \
  --prompt-data "${DATA}/train.jsonl" --input-key prompt --label-key label --apply-chat-template \
  --rm-type math --rollout-shuffle --rollout-seed "${SEED}" \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size 16 --n-samples-per-prompt 4 \
  --rollout-max-response-len 16 --rollout-temperature 1.0 \
  --eval-interval "${NUM_ROLLOUT}" --eval-prompt-data heldout "${DATA}/eval.jsonl" --eval-temperature 1.0 \
  --advantage-estimator grpo --normalize-advantages --calculate-per-token-loss --eps-clip 0.2 \
  --lr 1e-3 --lr-warmup-iters 2 --clip-grad 1.0 --seed "${SEED}" \
  --use-dynamic-batch-size --max-tokens-per-gpu 8192 \
  "$@"

python3 - "${RUN_DIR}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
kl = [r["opd/kl_to_teacher"] for r in rows if "opd/kl_to_teacher" in r]
first, last = sum(kl[:3]) / len(kl[:3]), sum(kl[-3:]) / len(kl[-3:])
print(f"student KL to teacher (nats/token, mean of 3 steps): first={first:.3f} last={last:.3f}")
s = json.load(open(f"{sys.argv[1]}/summary.json"))["heldout"]
print(f"eval accuracy: before={s['before']:.3f} after={s['after']:.3f}")
PY
