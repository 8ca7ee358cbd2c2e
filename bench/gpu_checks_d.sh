#!/usr/bin/env bash
# The flags issue 34 built last, on one GPU (H100 or H200): their CUDA paths run for real.
#
#   part 1: the CUDA unit tests (profiler trace with kernels, memory snapshots and the OOM dump, the
#           memory check around NCCL, the allocator margin, kept weights), then the fsdp colocate
#           quickstart (4 steps) with the profiler, memory history, memory check, margin,
#           --keep-old-actor --update-weights-interval 2, --check-weight-update-equal and --async-save
#   part 2: the megatron colocate quickstart (4 steps: packed rows, --recompute-loss-function,
#           --async-save) and the fully-async quickstart (4 steps: --keep-old-actor at staleness 1,
#           --check-weight-update-equal)
#
#   source .gpu-bundle/setup.sh && OUT_DIR=$OUT bash bench/gpu_checks_d.sh 1   (then ... 2)
# Each step logs `=== name: exit N` in $OUT_DIR/part<N>.log; `check` lines say what the outputs hold.
set -u
cd "$(dirname "$0")/.."
PART=${1:?part 1 or 2}
OUT_DIR=${OUT_DIR:-outputs/gpu-checks-d}
LOG="$OUT_DIR/part$PART.log"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)

step() {  # step SECONDS NAME COMMAND...
    local limit=$1 name=$2
    shift 2
    echo "=== $name: start at +$(($(date +%s) - T0)) s" >>"$LOG"
    timeout "$limit" "$@" >>"$LOG" 2>&1
    echo "=== $name: exit $? at +$(($(date +%s) - T0)) s" >>"$LOG"
}

check() {  # check EXP_DIR: what a quickstart left behind (traces, snapshots, metrics, checkpoints)
    python3 - "$1" >>"$LOG" 2>&1 <<'PY'
import json, sys
from pathlib import Path
exp = Path(sys.argv[1]); run = exp / "run"
rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").exists() else []
keys = sorted({k for r in rows for k in r if k.startswith(("memory/", "weight_sync/check", "train/ppo_kl"))})
print("check steps", [r.get("step") for r in rows], "keys", keys)
print("check ppo_kl", [round(r["train/ppo_kl"], 5) for r in rows if "train/ppo_kl" in r])
traces = sorted(str(p.relative_to(run)) for p in run.glob("train_trace/**/*.json.gz"))
print("check traces", len(traces), traces[:6])
if traces:
    import gzip
    events = json.load(gzip.open(run / traces[0]))["traceEvents"]
    print("check cuda kernels in the first trace:", sum(e.get("cat") == "kernel" for e in events))
print("check snapshots", sorted(str(p.relative_to(run)) for p in run.glob("memory_snapshot/*")))
ckpt = exp / "ckpt"
if ckpt.exists():
    print("check checkpoint latest", (ckpt / "latest_checkpointed_iteration.txt").read_text().strip(),
          sorted(p.name for p in ckpt.iterdir()))
PY
}

quick() {  # quick NAME MODE EXP ARGS...: a 4-step tiny quickstart (preparation cached in /tmp/tiny-gpu)
    local name=$1 mode=$2 exp=$3
    shift 3
    step 280 "$name" env MODE="$mode" MAX_STALENESS=1 NUM_ROLLOUT=4 EVAL_INTERVAL=0 EXP_DIR="$exp" MODEL_DIR=/tmp/tiny-gpu \
        DATA_DIR=/tmp/tiny-gpu bash scripts/training/text/run-tiny-cpu.sh --save "$exp/ckpt" --save-interval 2 \
        --async-save "$@"
    check "$exp"
}

{ nvidia-smi -L; } >>"$LOG" 2>&1
if [ "$PART" = 1 ]; then
    step 200 cuda_unit_tests python3 -m pytest -p no:xdist -o addopts="" -q -p no:cacheprovider \
        tests/unit/backends/trainer/test_profiling_cuda.py tests/unit/backends/trainer/test_memory_margin.py \
        tests/unit/backends/trainer/test_kept_weights.py tests/unit/backends/trainer/test_trainer_async_save.py
    quick fsdp_flags colocate /tmp/gpu-d-fsdp --train-backend fsdp --use-pytorch-profiler \
        --profile-step-start 1 --profile-step-end 2 --record-memory-history --memory-snapshot-num-steps 2 \
        --enable-cuda-memory-check --train-memory-margin-bytes 1GB --keep-old-actor --update-weights-interval 2 \
        --check-weight-update-equal
else
    quick megatron_flags colocate /tmp/gpu-d-megatron --train-backend megatron --recompute-loss-function
    quick async_keep_old async /tmp/gpu-d-async --keep-old-actor --check-weight-update-equal
fi
echo "=== part $PART done at +$(($(date +%s) - T0)) s" >>"$LOG"
