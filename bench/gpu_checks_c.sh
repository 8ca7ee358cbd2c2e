#!/usr/bin/env bash
# The third lease on four GPUs (about 6 minutes): the async-speedup rows the second lease cut off,
# all three modes in one lease, and --save-hf after an offload on megatron TP=2 (d491f8d).
#
#   lane A, GPUs 0,1: bench/gpu_async_speedup.py --only colocate_no_offload, then --only fully_async
#   lane B, GPUs 2,3: bench/gpu_async_speedup.py --only colocate, then the megatron TP=2 colocate
#                     quickstart (4 steps) with --save-hf after the last step's offload, and the
#                     exported checkpoint loaded back by transformers
#
#   source .gpu-bundle/setup.sh && OUT_DIR=$OUT bash bench/gpu_checks_c.sh
# Each mode prints `mode {json}` (its row) in a.log / b.log; the speedup is formed from those rows.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-outputs/gpu-checks-c}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
SPEEDUP_ARGS=(--gpus 2 --steps 16 --rollout-batch-size 16)

step() {  # step LOG SECONDS NAME COMMAND...: run under a timeout, logging start, end, status, time since T0
    local log=$1 limit=$2 name=$3
    shift 3
    echo "=== $name: start at +$(($(date +%s) - T0)) s" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    echo "=== $name: exit $? at +$(($(date +%s) - T0)) s" >>"$log"
}

lane_a() {
    export CUDA_VISIBLE_DEVICES=0,1
    step "$OUT_DIR/a.log" 260 colocate_no_offload python3 bench/gpu_async_speedup.py "${SPEEDUP_ARGS[@]}" \
        --only colocate_no_offload --exp-dir /tmp/bench-speedup-a
    step "$OUT_DIR/a.log" 260 fully_async python3 bench/gpu_async_speedup.py "${SPEEDUP_ARGS[@]}" \
        --only fully_async --exp-dir /tmp/bench-speedup-a
}

lane_b() {
    export CUDA_VISIBLE_DEVICES=2,3
    step "$OUT_DIR/b.log" 260 colocate python3 bench/gpu_async_speedup.py "${SPEEDUP_ARGS[@]}" \
        --only colocate --exp-dir /tmp/bench-speedup-b
    step "$OUT_DIR/b.log" 220 save_hf_megatron_tp2 env MODE=colocate NUM_ROLLOUT=4 EVAL_INTERVAL=0 \
        EXP_DIR=/tmp/tiny-tp2 bash scripts/training/text/run-tiny-cpu.sh --train-backend megatron \
        --tensor-model-parallel-size 2 --resource '{"actor": [1, 2], "rollout": [1, 2], "reference": [1, 2]}' \
        --save-hf /tmp/tiny-tp2/hf
    step "$OUT_DIR/b.log" 60 load_exported python3 -c "
import transformers
m = transformers.AutoModelForCausalLM.from_pretrained('/tmp/tiny-tp2/hf')
print('exported model loads: vocab', m.config.vocab_size, 'embedding rows', m.get_input_embeddings().weight.shape[0])"
}

{ nvidia-smi -L; } >"$OUT_DIR/machine.log" 2>&1
lane_a &
lane_b &
wait
echo "=== all done at +$(($(date +%s) - T0)) s" >>"$OUT_DIR/machine.log"
