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

from relax.distributed.weights.sender import FLAT_DEPTH

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
    # which the hf engine takes (flat buckets, FLAT_DEPTH in flight).
    assert [(p["protocol"], p["bucket_mib"], p["depth"], p["flat"]) for p in result["pushes"]] == [
        ("sglang", 1, 1, False), ("sglang", 4, 1, False), ("relax", 1, FLAT_DEPTH, True),
        ("relax", 4, FLAT_DEPTH, True)]
    # The tiny model's ~3.3 MB in 1 MiB buckets take several buckets, in 4 MiB one.
    assert result["pushes"][0]["buckets"] > 1 and result["pushes"][1]["buckets"] == 1
    assert all(p["bytes"] == result["bytes"] for p in result["pushes"])
    assert result["weight_sync_gbps"] > 0 and result["nccl_gbps"] > 0
    assert set(result["fixed_cost_fit"]) == {"sglang", "relax"} and "per_bucket_s" in result["fixed_cost_fit"]["relax"]
    # The timelines (one push per protocol): every control call, and the relax push's flat packs.
    timelines = {t["protocol"]: [name for name, _, _ in t["spans"]] for t in result["timelines"]}
    assert timelines["sglang"][:2] == ["/pause_generation", "/begin_weight_update"]
    assert "pack (sender)" in timelines["relax"] and "pack (sender)" not in timelines["sglang"]


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
