"""The CUDA side of the training ranks' profiling and memory flags, on a real GPU (skipped without CUDA):
- --use-pytorch-profiler: a GPU rank's trace holds CUDA kernels, its summary sorts by device time;
- --record-memory-history (torch): the snapshot after --memory-snapshot-num-steps steps is a pickle
  memory_viz reads (segments, the allocation trace), and an OOM dumps the history to its own file;
- --enable-cuda-memory-check: the reading is the GPU's, a collective's log line gives it, and a real
  OOM inside a checked collective carries it;
- a whole fsdp Trainer rank on the GPU (NCCL, world size 1) through marked steps with all three on.
Run: python3 -m pytest -n 0 -p no:cacheprovider tests/unit/backends/trainer/test_profiling_cuda.py -v
"""

from __future__ import annotations

import gzip
import json
import logging
import pickle

import pytest
import torch

from relax.backends.trainer import memory_history as mh
from relax.backends.trainer.profiling import RankProfiler
from relax.config.observability import TrainProfileConfig
from relax.utils import memory_check
from profiled_steps import run_profiled_steps

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPU = torch.device("cuda", 0)
TOO_MUCH = 1 << 50  # bytes no GPU has


def matmul() -> None:
    a = torch.randn(256, 256, device=GPU)
    (a @ a).sum().item()


def events(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_a_gpu_rank_traces_cuda_kernels(tmp_path):
    prof = RankProfiler(TrainProfileConfig(use_pytorch_profiler=True, profile_step_start=0, profile_step_end=0),
                        str(tmp_path), "actor", 0, GPU)
    prof.step_begin()
    matmul()
    prof.step_end()
    (trace,) = tmp_path.rglob("*.pt.trace.json.gz")
    assert "kernel" in {e.get("cat") for e in events(trace)}
    assert "CUDA" in next(tmp_path.rglob("*.txt")).read_text()  # sorted by device time


def test_the_snapshot_after_the_configured_steps_is_a_memory_viz_pickle(tmp_path):
    p = TrainProfileConfig(record_memory_history=True, memory_snapshot_dir=str(tmp_path), memory_snapshot_num_steps=2)
    rec = mh.memory_history(p, "actor", 0, GPU)
    rec.start()
    kept = []
    for step in range(3):
        kept.append(torch.empty(1 << 20, device=GPU))
        rec.step_done(step)
    rec.close()
    with open(tmp_path / "actor_rank0_snapshot.pickle", "rb") as f:
        snapshot = pickle.load(f)  # the file this test just wrote
    assert snapshot["segments"] and any(snapshot["device_traces"])


def test_an_oom_dumps_the_history(tmp_path):
    p = TrainProfileConfig(record_memory_history=True, memory_snapshot_dir=str(tmp_path))
    rec = mh.memory_history(p, "actor", 0, GPU)
    rec.start()
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(TOO_MUCH, dtype=torch.uint8, device=GPU)
    finally:
        rec.close()
    assert (tmp_path / "actor_rank0_oom_snapshot.pickle").stat().st_size > 0


def test_a_real_oom_in_a_checked_collective_carries_the_gpu_memory(caplog):
    memory_check.enable(memory_check.cuda_memory(GPU))
    try:
        with caplog.at_level(logging.INFO, logger=memory_check.__name__):
            with memory_check.collective("gradient reduction"):
                matmul()
        with pytest.raises(torch.OutOfMemoryError) as caught, memory_check.collective("weight gather for a push"):
            torch.empty(TOO_MUCH, dtype=torch.uint8, device=GPU)
    finally:
        memory_check.disable()
    total = torch.cuda.mem_get_info(GPU)[1] / (1 << 30)
    assert "gradient reduction: " in caplog.text and f"of {total:.2f} GiB" in caplog.text
    assert "weight gather for a push failed; GPU memory before it" in caught.value.__notes__[0]


def test_a_weight_broadcast_over_nccl_is_checked(caplog):
    from relax.distributed.weights.group import create_weight_group
    from relax.utils.net import free_port

    memory_check.enable(memory_check.cuda_memory(GPU))
    group = create_weight_group(master_address="127.0.0.1", master_port=free_port(), rank=0, world_size=1,
                                group_name="lane1", backend="nccl", timeout_s=60, device=GPU)
    try:
        with caplog.at_level(logging.INFO, logger=memory_check.__name__):
            group.broadcast(torch.ones(4, device=GPU))
    finally:
        group.destroy()
        memory_check.disable()
    assert "weight broadcast (lane1): " in caplog.text and "GiB free" in caplog.text


def test_a_gpu_trainer_rank_profiles_records_and_checks(tmp_path, caplog):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig
    from relax.types import TrainBatch
    from relax.utils.net import free_port

    model = tmp_path / "model"
    Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                                 pad_token_id=0)).save_pretrained(model)
    profile = TrainProfileConfig(use_pytorch_profiler=True, profile_step_start=1, profile_step_end=1,
                                 profile_target=["train_overall", "train_actor", "train_log_probs"],
                                 record_memory_history=True, memory_snapshot_dir=str(tmp_path / "snap"),
                                 memory_snapshot_num_steps=2, enable_cuda_memory_check=True)
    spec = TrainerSpec(model_path=str(model), optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=2),
                       loss=PolicyLossConfig(), total_steps=3, name="actor", profile=profile,
                       trace_dir=str(tmp_path / "train_trace"))
    w = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    b = TrainBatch(tokens_RL=[[1, 2, 3, 4], [3, 4, 5, 6, 7]], response_lengths_R=[2, 3],
                   loss_masks_RT=[[1, 1], [1, 1, 1]], advantages_RT=[[1.0] * 2, [-1.0] * 3])
    try:
        with caplog.at_level(logging.INFO, logger=memory_check.__name__):
            run_profiled_steps(w, b)
    finally:
        w.shutdown()
    (trace,) = (tmp_path / "train_trace").rglob("*.pt.trace.json.gz")
    assert trace.name == "rank0_step1.pt.trace.json.gz" and trace.parent.name == "train_overall"
    names = {e.get("name") for e in events(trace)}
    assert {"train_actor", "train_log_probs"} <= names and "kernel" in {e.get("cat") for e in events(trace)}
    assert (tmp_path / "snap" / "actor_rank0_snapshot.pickle").stat().st_size > 0
    assert "gradient norm: " in caplog.text and "GiB free" in caplog.text
