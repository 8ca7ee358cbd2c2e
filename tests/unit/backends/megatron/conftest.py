"""These tests compare the megatron and fsdp backends in float32 on the CPU over gloo (two spawned
ranks share the machine). On a GPU machine they run on the CPU too: two ranks cannot share one GPU
over NCCL; GPU numerics are checked by tests/unit/backends/test_megatron_gpu.py (one GPU per rank)
and measured by bench/megatron_throughput.py. Set before any
test of this folder queries CUDA; spawned ranks inherit it."""

import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""
