#!/usr/bin/env bash
# The second short lease on four GPUs (about 9 minutes): the steady-state fully-async speedup and
# megatron's tensor-parallel throughput and quickstart. Logs and JSON land in OUT_DIR as they go.
#
#   lane A, GPUs 0,1: bench/gpu_async_speedup.py --steps 16 (colocate with offload, colocate
#                     without, fully async; the speedup over the second half of the steps)
#   lane B, GPUs 2,3: bench/megatron_throughput.py --tp 2 (4B-shaped, 12 layers, compiled;
#                     megatron TP=2 and fsdp DP=2), then the colocate quickstart on megatron with
#                     --tensor-model-parallel-size 2 (the tiny model's 325-token vocabulary, padded)
#   then, all four:   bench/megatron_throughput.py --tp 4 (megatron TP=4 and fsdp DP=4)
#
#   source .gpu-bundle/setup.sh && OUT_DIR=$OUT bash bench/gpu_checks_b.sh
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-outputs/gpu-checks-b}
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
    step "$OUT_DIR/a.log" 410 async_speedup python3 bench/gpu_async_speedup.py --gpus 2 --steps 16 \
        --rollout-batch-size 16 --exp-dir /tmp/bench-gpu-async-speedup --out "$OUT_DIR/gpu_async_speedup.json"
}

lane_b() {
    export CUDA_VISIBLE_DEVICES=2,3
    step "$OUT_DIR/b.log" 190 megatron_tp2 python3 bench/megatron_throughput.py --shape 4b --layers 12 --tp 2 \
        --compiled-only --out "$OUT_DIR/megatron_tp2.json"
    step "$OUT_DIR/b.log" 220 quickstart_megatron_tp2 env MODE=colocate NUM_ROLLOUT=30 EVAL_INTERVAL=15 \
        EXP_DIR=/tmp/tiny-tp2 bash scripts/training/text/run-tiny-cpu.sh --train-backend megatron \
        --tensor-model-parallel-size 2 --resource '{"actor": [1, 2], "rollout": [1, 2], "reference": [1, 2]}'
}

{ nvidia-smi -L; } >"$OUT_DIR/machine.log" 2>&1
lane_a &
lane_b &
wait
unset CUDA_VISIBLE_DEVICES
step "$OUT_DIR/c.log" 130 megatron_tp4 python3 bench/megatron_throughput.py --shape 4b --layers 12 --tp 4 \
    --out "$OUT_DIR/megatron_tp4.json"
