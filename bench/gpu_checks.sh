#!/usr/bin/env bash
# The GPU-only paths changed since the last lease, checked in one short lease on four GPUs (about
# 9 minutes): three lanes side by side, then one step on all four. Logs and JSON land in OUT_DIR
# as they go, so a lease cut short still returns what finished.
#
#   lane A, GPUs 0,1: bench/weight_sync.py (0.6B-, then 4B-shaped; one bucket at a time and
#                     pipelined), then bench/offload.py (the colocate offload, pinned host buffers)
#   lane B, GPU 2:    the fully-async quickstart on one GPU (bench/gpu_quickstart.sh: its first
#                     weight push to ActorFwd is the one that failed by CUDA IPC)
#   lane C, GPU 3:    megatron vs fsdp in bf16 on one GPU (odd vocabulary, padded rows)
#   then, all four:   the two- and four-GPU megatron layouts (TP=2, TP=2+SP, PP=2, DP=2, EP=2,
#                     TP=2 x PP=2) against fsdp
#
#   source .gpu-bundle/setup.sh && OUT_DIR=$OUT bash bench/gpu_checks.sh
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-outputs/gpu-checks}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)

step() {  # step LOG SECONDS NAME COMMAND...: run under a timeout, logging start, end, status, time since T0
    local log=$1 limit=$2 name=$3
    shift 3
    echo "=== $name: start at +$(($(date +%s) - T0)) s" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    echo "=== $name: exit $? at +$(($(date +%s) - T0)) s" >>"$log"
}

lane_a() {
    export CUDA_VISIBLE_DEVICES=0,1
    step "$OUT_DIR/a.log" 240 weight_sync python3 bench/weight_sync.py --shapes 0.6b 4b --buckets-mib 128 512 2048 \
        --repeats 2 --out "$OUT_DIR/weight_sync.json"
    step "$OUT_DIR/a.log" 120 offload python3 bench/offload.py --out "$OUT_DIR/offload.json"
}

lane_b() {
    export CUDA_VISIBLE_DEVICES=2
    step "$OUT_DIR/b.log" 330 quickstart_async env MODES=async NUM_ROLLOUT=20 EVAL_INTERVAL=10 \
        bash bench/gpu_quickstart.sh "$OUT_DIR/quickstart"
}

lane_c() {
    export CUDA_VISIBLE_DEVICES=3
    step "$OUT_DIR/c.log" 240 parity_one_gpu python3 -m pytest -q -s -rs tests/unit/backends/test_megatron_gpu.py -k tp1
}

{ nvidia-smi -L; nvidia-smi topo -m; } >"$OUT_DIR/machine.log" 2>&1
lane_a &
lane_b &
lane_c &
wait
unset CUDA_VISIBLE_DEVICES
step "$OUT_DIR/c.log" 200 parity_two_four_gpus python3 -m pytest -q -s -rs tests/unit/backends/test_megatron_gpu.py \
    -k "not tp1"
