#!/bin/bash
# Qwen3-4B, fully async GRPO on DAPO-Math-17k, one node of 8 GPUs: 4 training ranks, 2 engines and
# 2 ActorFwd ranks, each on GPUs of its own, rollout at most 2 weight versions ahead (with --use-tis).
# The same recipe as run-qwen3-4B-8xgpu.sh (its header says how to check it with --dry-run --cluster).
exec env MODE=async bash "$(dirname -- "${BASH_SOURCE[0]}")/run-qwen3-4B-8xgpu.sh" "$@"
