"""`--enable-cuda-memory-check` (relax.utils.memory_check) with a fake GPU memory reading: each
collective logs the free memory before it; a failing one re-raises its own exception with the memory
before and after attached as a note; off, it does nothing. The weight sync's broadcast goes through
it (a one-rank gloo group). On a CPU rank the flag logs that it has no effect. The CUDA reading
itself: tests/unit/backends/trainer/test_profiling_cuda.py."""

from __future__ import annotations

import logging
import traceback

import pytest
import torch

from relax.utils import memory_check
from relax.utils.memory_check import GpuMemory

GIB = 1 << 30


@pytest.fixture
def fake_gpu():
    """A GPU whose free memory drops by 1 GiB at each reading (the check on, for this test only)."""
    readings = iter(range(10))
    memory_check.enable(lambda: GpuMemory(free=(8 - next(readings)) * GIB, total=80 * GIB, allocated=3 * GIB,
                                          reserved=4 * GIB))
    yield
    memory_check.disable()


def test_each_collective_logs_the_free_memory_before_it(fake_gpu, caplog):
    with caplog.at_level(logging.INFO, logger=memory_check.__name__):
        with memory_check.collective("gradient reduction"):
            pass
    assert "gradient reduction: 8.00 GiB free of 80.00 GiB; this process: 3.00 GiB allocated, 4.00 GiB reserved" \
        in caplog.text


def test_a_failed_collective_reraises_with_the_memory_attached(fake_gpu):
    error = RuntimeError("NCCL error: unhandled cuda error")
    with pytest.raises(RuntimeError) as caught:
        with memory_check.collective("weight broadcast (g)"):
            raise error
    assert caught.value is error  # the collective's own exception, unchanged but for the note
    (note,) = caught.value.__notes__
    assert note.startswith("--enable-cuda-memory-check: weight broadcast (g) failed; GPU memory before it: 8.00 GiB")
    assert "after: 7.00 GiB free" in note
    assert "7.00 GiB free" in "".join(traceback.format_exception(caught.value))


def test_a_reading_that_fails_after_the_failure_is_said():
    readings: list[int] = []

    def read() -> GpuMemory:  # the first reading works, the one after the failure does not
        readings.append(1)
        if len(readings) > 1:
            raise RuntimeError("CUDA error: an illegal memory access")
        return GpuMemory(1, 2, 0, 0)

    memory_check.enable(read)
    try:
        with pytest.raises(ValueError) as caught, memory_check.collective("x"):
            raise ValueError("boom")
    finally:
        memory_check.disable()
    assert "after: unavailable (RuntimeError: CUDA error: an illegal memory access)" in caught.value.__notes__[0]


def test_off_it_neither_reads_nor_logs(caplog):
    assert not memory_check.enabled()
    with caplog.at_level(logging.INFO, logger=memory_check.__name__):
        with pytest.raises(KeyError) as caught, memory_check.collective("x"):
            raise KeyError("k")
    assert not caplog.text and not getattr(caught.value, "__notes__", None)


def test_the_weight_broadcast_runs_inside_the_check(fake_gpu, caplog):
    from relax.distributed.weights.group import create_weight_group
    from relax.utils.net import free_port

    group = create_weight_group(master_address="127.0.0.1", master_port=free_port(), rank=0, world_size=1,
                                group_name="lane1", timeout_s=30)
    try:
        with caplog.at_level(logging.INFO, logger=memory_check.__name__):
            group.broadcast(torch.ones(3))
            group.broadcast_queued(torch.ones(3)).wait()
    finally:
        group.destroy()
    assert "weight broadcast (lane1): 8.00 GiB free" in caplog.text
    assert "weight broadcast, queued (lane1): 7.00 GiB free" in caplog.text


def test_a_cpu_rank_says_the_check_has_no_effect(caplog):
    from relax.backends.trainer import profiling
    from relax.config.observability import TrainProfileConfig

    with caplog.at_level(logging.WARNING, logger=profiling.__name__):
        profiling.RankProfiler(TrainProfileConfig(enable_cuda_memory_check=True), None, "actor", 0,
                               torch.device("cpu"))
    assert "--enable-cuda-memory-check" in caplog.text and "needs a CUDA GPU" in caplog.text
    assert not memory_check.enabled()
