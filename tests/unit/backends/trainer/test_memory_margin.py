"""--train-memory-margin-bytes (`relax.backends.trainer.memory_margin`): on a GPU shared with the
engines, training leaves the margin free (the rank's CUDA allocator is capped) and fails at once,
naming the flag, when less is free already. On CPU nothing happens. The GPU tests run with
`python3 -m pytest -n 0 -p no:cacheprovider -m gpu tests/unit/backends/trainer/test_memory_margin.py`."""

from __future__ import annotations

import pytest
import torch

from relax.backends.trainer.memory_margin import MemoryMarginError, reserve_margin

MIB = 1 << 20
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_no_margin_on_cpu_or_when_zero():
    assert reserve_margin(torch.device("cpu"), 1 << 30, "actor") == {}
    assert reserve_margin(torch.device("cuda", 0), 0, "actor") == {}  # (no CUDA call is made)


@pytest.fixture
def gpu():
    device = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    yield device
    torch.cuda.set_per_process_memory_fraction(1.0, device)  # the cap is per process: lift it again
    torch.cuda.empty_cache()


@pytest.mark.gpu
@cuda
def test_less_free_than_the_margin_fails_naming_the_flag(gpu):
    free, _ = torch.cuda.mem_get_info(gpu)
    with pytest.raises(MemoryMarginError, match="--train-memory-margin-bytes"):
        reserve_margin(gpu, free + 256 * MIB, "actor")


@pytest.mark.gpu
@cuda
def test_training_allocations_stop_short_of_the_margin(gpu):
    free, _ = torch.cuda.mem_get_info(gpu)
    margin = free - 512 * MIB  # leave the trainer 512 MiB more than it holds
    metrics = reserve_margin(gpu, margin, "actor")
    assert metrics["memory/train_margin_gib"] == pytest.approx(margin / (1 << 30))
    small = torch.empty(128 * MIB, dtype=torch.uint8, device=gpu)  # within the cap
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(1024 * MIB, dtype=torch.uint8, device=gpu)  # would eat into the margin
    assert torch.cuda.mem_get_info(gpu)[0] >= margin
    del small
