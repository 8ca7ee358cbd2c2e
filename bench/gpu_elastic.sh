#!/usr/bin/env bash
# ray_native scale-out on GPUs: the tiny quickstart, fully async on a 4-GPU machine without a KL
# Reference (Actor, ActorFwd and one engine: a GPU each), grows by one engine mid-run (it takes the
# fourth GPU, outside the run's placement group), then shrinks back to one; prints what
# `relax-scale status` and nvidia-smi saw, the operations, and every step's engine count and
# sample count. Usage (on a machine with 4 GPUs): bash bench/gpu_elastic.sh OUT_DIR
set -euo pipefail
OUT="${1:-/tmp/gpu-elastic}"
mkdir -p "${OUT}"
EXP=/tmp/tiny-gpu-elastic
rm -rf "${EXP}"
export MODE=async NUM_ROLLOUT="${NUM_ROLLOUT:-24}" EVAL_INTERVAL=0 SAVE_INTERVAL=0 EXP_DIR="${EXP}" KL_LOSS_COEF=0
bash scripts/training/text/run-tiny-cpu.sh --resource \
  '{"actor": [1, 1], "rollout": [1, 1], "actor_fwd": [1, 1], "advantages": [1, 0]}' \
  > "${OUT}/run.log" 2>&1 &
RUN=$!
wait_for() { for _ in $(seq 1 600); do grep -q "$1" "${OUT}/run.log" && return 0; kill -0 "${RUN}" 2>/dev/null || return 1; sleep 1; done; return 1; }
scale() { python3 -m relax.entrypoints.scale --exp-dir "${EXP}/run" "$@" 2>&1 | tee -a "${OUT}/scale.log"; }
wait_for "step 3/" || { echo "run did not reach step 3"; tail -60 "${OUT}/run.log"; exit 1; }
scale status
scale --wait --timeout 600 up 1 || echo "scale-out failed (see above)"
scale status
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv | tee "${OUT}/nvidia_smi_scaled.csv"
nvidia-smi -L | tee -a "${OUT}/nvidia_smi_scaled.csv"
wait_for "step 12/" || true
scale --wait --timeout 600 down 1 || echo "scale-in failed (see above)"
scale status
wait "${RUN}"; echo "run exit: $?"
tail -5 "${OUT}/run.log"
cp "${EXP}/run/metrics.jsonl" "${OUT}/metrics.jsonl" 2>/dev/null || true
python3 - "${EXP}/run/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "time/step" in r]
for r in rows:
    print("step %3d engines %s samples %s added %s removed %s" % (r.get("step", -1), r.get("elastic/engines"),
          r.get("rollout/num_samples"), r.get("elastic/engines_added"),
          r.get("elastic/engines_removed")))
PY
