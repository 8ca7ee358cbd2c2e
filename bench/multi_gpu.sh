#!/usr/bin/env bash
# The several-GPU measurements (weight-sync bandwidth, Megatron parallel parity and MFU, the
# fully-async speedup) on one machine with four GPUs, as two lanes of two GPUs side by side so a
# short lease gets the most out of them. Each step writes its log or JSON under OUT_DIR as it goes,
# so a lease cut short still returns what finished.
#
#   lane A, GPUs 0,1: bench/weight_sync.py (4B-, then 0.6B-shaped), bench/megatron_throughput.py
#                     --tp 2 (4B-shaped, 12 layers, compiled; megatron and fsdp)
#   lane B, GPUs 2,3: tests/unit/backends/test_megatron_gpu.py (one- and two-GPU layouts), then
#                     bench/gpu_async_speedup.py on two GPUs (fully async, then colocate)
#   then, all four:   the TP=2 x PP=2 parity layout, megatron_throughput --tp 4; last, on two, the
#                     colocate quickstart with --train-backend megatron --tensor-model-parallel-size 2
#
#   OUT_DIR=/tmp/multi-gpu bash bench/multi_gpu.sh       # on the GPU machine; NCCL_NVLS_ENABLE=0 kept
#   PHASES=lanes bash bench/multi_gpu.sh; PHASES=four bash bench/multi_gpu.sh   # the same in two calls
#
# Steps of one lane run in turn; a failing step is logged and the lane goes on; STEP_TIMEOUT
# (seconds, default 900) bounds each step.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-outputs/multi-gpu}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)

step() {  # step LOG NAME COMMAND...: run, logging start, end, exit status and seconds since T0
    local log=$1 name=$2
    shift 2
    echo "=== $name: start at +$(($(date +%s) - T0)) s" >>"$log"
    timeout "${STEP_TIMEOUT:-900}" "$@" >>"$log" 2>&1
    echo "=== $name: exit $? at +$(($(date +%s) - T0)) s" >>"$log"
}

lane_a() {
    export CUDA_VISIBLE_DEVICES=0,1
    step "$OUT_DIR/a.log" weight_tests python3 -m pytest -q -rs tests/unit/distributed/weights
    step "$OUT_DIR/a.log" weight_sync_4b python3 bench/weight_sync.py --shapes 4b --buckets-mib 128 512 2048 \
        --out "$OUT_DIR/weight_sync_4b.json"
    step "$OUT_DIR/a.log" weight_sync_0.6b python3 bench/weight_sync.py --shapes 0.6b --buckets-mib 128 512 2048 \
        --out "$OUT_DIR/weight_sync_0.6b.json"
    step "$OUT_DIR/a.log" megatron_tp2 python3 bench/megatron_throughput.py --shape 4b --layers 12 --tp 2 \
        --compiled-only --out "$OUT_DIR/megatron_tp2.json"
}

lane_b() {
    export CUDA_VISIBLE_DEVICES=2,3
    step "$OUT_DIR/b.log" parity_1_2_gpus python3 -m pytest -q -s -rs \
        tests/unit/backends/test_megatron_gpu.py -k "not tp2pp2"
    for mode in fully_async colocate; do
        step "$OUT_DIR/b.log" "async_speedup_$mode" python3 bench/gpu_async_speedup.py --gpus 2 --steps 4 \
            --rollout-batch-size 16 --only "$mode" --exp-dir /tmp/bench-gpu-async-speedup
    done
}

four_gpus() {
    unset CUDA_VISIBLE_DEVICES
    step "$OUT_DIR/c.log" parity_tp2pp2 python3 -m pytest -q -s -rs \
        tests/unit/backends/test_megatron_gpu.py -k tp2pp2
    step "$OUT_DIR/c.log" megatron_tp4 python3 bench/megatron_throughput.py --shape 4b --layers 12 --tp 4 \
        --compiled-only --out "$OUT_DIR/megatron_tp4.json"
    # The colocate quickstart with megatron TP=2 on two GPUs (actor, reference and two engines share them).
    export CUDA_VISIBLE_DEVICES=0,1
    step "$OUT_DIR/c.log" quickstart_megatron_tp2 env MODE=colocate NUM_ROLLOUT=40 EXP_DIR=/tmp/tiny-tp2 \
        bash scripts/training/text/run-tiny-cpu.sh --train-backend megatron --tensor-model-parallel-size 2 \
        --resource '{"actor": [1, 2], "rollout": [1, 2], "reference": [1, 2]}'
}

PHASES=${PHASES:-lanes four}
{ nvidia-smi -L; nvidia-smi topo -m; } >"$OUT_DIR/machine.log" 2>&1
if [[ " $PHASES " == *" lanes "* ]]; then
    lane_a &
    lane_b &
    wait
fi
if [[ " $PHASES " == *" four "* ]]; then
    four_gpus
fi
