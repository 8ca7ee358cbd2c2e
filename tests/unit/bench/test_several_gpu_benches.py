"""The several-GPU benches' CPU variants: bench/weight_sync.py end to end over gloo (a real hf
engine server, a real sender, a raw broadcast in a second process), and the long-tailed lengths
that bench/gpu_async_speedup.py gives both of its runs."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from relax.distributed.weights.sender import DEFAULT_PIPELINE_DEPTH, FLAT_DEPTH

from bench.long_tail_generate import response_length

ROOT = Path(__file__).resolve().parents[3]


def test_weight_sync_bench_runs_on_cpu(tmp_path):
    out = tmp_path / "weight_sync.json"
    proc = subprocess.run([sys.executable, "bench/weight_sync.py", "--cpu", "--shapes", "tiny", "--buckets-mib", "1",
                           "4", "--repeats", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"weight_sync_gbps=[\d.]+ nccl_gbps=[\d.]+ ratio=[\d.]+", last), last
    result = json.loads(out.read_text())["results"][0]
    # Each bucket size in plain SGLang (one bucket at a time, per tensor) and with Relax's extensions,
    # which the hf engine takes: pipelined, then flat buckets (FLAT_DEPTH in flight), then armed, then ahead.
    assert [(p["protocol"], p["bucket_mib"], p["depth"], p["flat"], p["armed"]) for p in result["pushes"]] == [
        ("sglang", 1, 1, False, False), ("sglang", 4, 1, False, False),
        ("per-tensor", 1, DEFAULT_PIPELINE_DEPTH, False, False),
        ("per-tensor", 4, DEFAULT_PIPELINE_DEPTH, False, False),
        ("flat", 1, FLAT_DEPTH, True, False), ("flat", 4, FLAT_DEPTH, True, False),
        ("armed", 1, FLAT_DEPTH, True, True), ("armed", 4, FLAT_DEPTH, True, True),
        ("ahead", 1, FLAT_DEPTH, True, True), ("ahead", 4, FLAT_DEPTH, True, True)]
    # The tiny model's ~3.3 MB in 1 MiB buckets take several buckets, in 4 MiB one.
    assert result["pushes"][0]["buckets"] > 1 and result["pushes"][1]["buckets"] == 1
    assert all(p["bytes"] == result["bytes"] for p in result["pushes"])
    assert result["weight_sync_gbps"] > 0 and result["nccl_gbps"] > 0
    protocols = {"sglang", "per-tensor", "flat", "armed", "ahead"}
    assert set(result["fixed_cost_fit"]) == protocols and "per_bucket_s" in result["fixed_cost_fit"]["armed"]
    assert set(result["default_bucket_ratios"]) == protocols and result["ratio_bucket_mib"] == 4  # (nearest 512)
    # The timelines (one push per protocol): every control call, and the flat pushes' packs.
    timelines = {t["protocol"]: [name for name, _, _ in t["spans"]] for t in result["timelines"]}
    assert timelines["sglang"][:2] == ["/pause_generation", "/begin_weight_update"]
    assert "pack (sender)" in timelines["flat"] and "pack (sender)" not in timelines["sglang"]
    for protocol in ("armed", "ahead"):  # (the group's destroy is the sender's close)
        control = [n for n in timelines[protocol] if n.startswith("/") and n != "/destroy_weights_update_group"]
        assert control == ["/arm_weight_update", "/end_weight_update"], protocol


def test_long_tail_lengths_are_fixed_by_seed_and_index_and_capped():
    lengths = [response_length(7, i, 96, 512) for i in range(4000)]
    assert lengths == [response_length(7, i, 96, 512) for i in range(4000)]  # both modes get the same
    assert lengths != [response_length(8, i, 96, 512) for i in range(4000)]
    assert 1 <= min(lengths) and max(lengths) == 512  # the cap is reached: a long tail
    assert 85 < statistics.mean(lengths) < 100  # exponential(96), slightly cut by the cap
    assert statistics.median(lengths) < 0.75 * statistics.mean(lengths)  # most are short


def test_megatron_throughput_bench_runs_tensor_parallel_ranks_on_cpu(tmp_path):
    """bench/megatron_throughput.py --cpu: megatron with TP=2 over two ranks (spawned processes, gloo;
    fsdp takes the same spawning path, data-parallel, when not left out by --backends)."""
    pytest.importorskip("megatron.core")
    out = tmp_path / "megatron_throughput.json"
    proc = subprocess.run([sys.executable, "bench/megatron_throughput.py", "--cpu", "--shape", "tiny", "--tp", "2",
                           "--backends", "megatron", "--train-batch", "4", "--train-len", "24", "--prompt-len", "8",
                           "--train-steps", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "megatron_mfu=nan fsdp_mfu=nan"  # no GPU peak to divide by
    rows = json.loads(out.read_text())["train"]
    assert set(rows) == {"megatron tp=2"}
    assert all(r["seconds"] > 0 and r["tokens_per_s"] > 0 and "error" not in r for r in rows.values()), rows


def test_the_profile_summary_sorts_gpu_kernels_by_kind():
    """bench/gpu_throughput.py --profile: where a step's GPU time goes, by kernel name (CUDA 12/13 names)."""
    from bench.gpu_throughput import kernel_kind

    assert kernel_kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication"
    assert kernel_kind("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>") == "attention"
    assert kernel_kind("pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention"
    assert kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kernel_kind("nvjet_tst_192x192_64x3_1x2_h_bz_coopB_TNN") == "matmul"
    assert kernel_kind("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "other"


def test_overlapped_communication_counts_only_time_beside_other_kernels():
    """--profile's `communication_overlapped`: a collective's time while any other kernel ran,
    overlapping compute kernels counted once; a collective alone counts nothing."""
    from bench.gpu_throughput import comm_overlapped_us

    kernels = [(0, 10, False), (8, 12, False), (5, 15, True), (20, 30, True), (22, 24, True)]
    assert comm_overlapped_us(kernels) == 7.0  # 5..12 beside the two compute kernels (merged: 0..12)
    assert comm_overlapped_us([(0, 5, True), (5, 9, False)]) == 0.0
    assert comm_overlapped_us([]) == 0.0


def test_inductor_settings_reach_inductors_config_and_bad_ones_are_named():
    """bench/megatron_throughput.py --inductor KEY=VALUE: JSON values, dotted keys into sub-configs,
    an unknown key or a pair without `=` refused with the flag named."""
    import torch._inductor.config as config

    from bench.gpu_throughput import inductor_settings, set_inductor_config

    settings = inductor_settings(["reorder_for_compute_comm_overlap=true",
                                  "aten_distributed_optimizations.enable_overlap_scheduling=true"])
    assert settings == {"reorder_for_compute_comm_overlap": True,
                        "aten_distributed_optimizations.enable_overlap_scheduling": True}
    sub = config.aten_distributed_optimizations
    before = config.reorder_for_compute_comm_overlap, sub.enable_overlap_scheduling
    try:
        set_inductor_config(settings)
        assert (config.reorder_for_compute_comm_overlap, sub.enable_overlap_scheduling) == (True, True)
    finally:
        config.reorder_for_compute_comm_overlap, sub.enable_overlap_scheduling = before
    with pytest.raises(SystemExit, match="--inductor no_such_setting: .*no such setting"):
        set_inductor_config({"no_such_setting": 1})
    with pytest.raises(SystemExit, match="--inductor reorder: expected KEY=VALUE"):
        inductor_settings(["reorder"])
    with pytest.raises(SystemExit, match="VALUE is JSON"):
        inductor_settings(["reorder_for_compute_comm_overlap=yes"])


def test_async_tp_needs_sequence_parallel_compiled_layers_and_sets_inductors_micro_pipeline(monkeypatch):
    """bench/megatron_throughput.py --async-tp (docs/gpu.md): refused, flags named, without the
    sequence-parallel collectives and compiled layers it overlaps; its inductor setting exists in this torch."""
    import torch._inductor.config as config

    from bench.gpu_throughput import set_inductor_config

    for extra in ([], ["--sequence-parallel"], ["--compiled-only"]):
        proc = subprocess.run([sys.executable, "bench/megatron_throughput.py", "--async-tp", *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--async-tp needs --sequence-parallel and --compiled-only" in proc.stderr
    monkeypatch.setattr(config, "_micro_pipeline_tp", False)
    set_inductor_config({"_micro_pipeline_tp": True})
    assert config._micro_pipeline_tp is True
