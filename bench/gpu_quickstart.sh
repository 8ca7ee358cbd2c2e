#!/usr/bin/env bash
# The CPU quickstart on one GPU (every role on it): colocate, then fully async. Prints each run's
# eval accuracy and its per-phase GPU memory (from metrics.jsonl). Usage (on a GPU machine):
#   NUM_ROLLOUT=40 bash bench/gpu_quickstart.sh OUT_DIR
set -euo pipefail
OUT="${1:-/tmp/gpu-quickstart}"
mkdir -p "${OUT}"
export NUM_ROLLOUT="${NUM_ROLLOUT:-40}" EVAL_INTERVAL="${EVAL_INTERVAL:-20}" SAVE_INTERVAL=0
for mode in ${MODES:-colocate async}; do
  exp="/tmp/tiny-gpu-${mode}"
  start=$(date +%s)
  MODE="${mode}" EXP_DIR="${exp}" bash scripts/training/text/run-tiny-cpu.sh > "${OUT}/${mode}.log" 2>&1 \
    || { echo "${mode} run failed:"; tail -40 "${OUT}/${mode}.log"; exit 1; }
  echo "== ${mode}: $(( $(date +%s) - start ))s; $(grep 'eval accuracy' "${OUT}/${mode}.log")"
  cp "${exp}/run/metrics.jsonl" "${OUT}/${mode}-metrics.jsonl"
  python3 - "${exp}/run/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "time/step" in r]  # (eval rows have no step time)
keys = sorted({k for r in rows for k in r if k.startswith("memory/")})
print("   memory (GiB, max over steps): " + ", ".join(f"{k[7:]}={max(r.get(k, 0) for r in rows):.3f}" for k in keys))
print("   step time (s, median): %.2f" % sorted(r["time/step"] for r in rows)[len(rows) // 2])
PY
done
