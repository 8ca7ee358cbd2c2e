"""`--record-memory-history` on a training rank (relax.backends.trainer.memory_history), on CPU: the
torch recorder's calls (recording from the start, the dump after --memory-snapshot-num-steps steps,
the OOM observer's dump) against fakes of torch's CUDA functions, the memray recorder against a fake
memray, and a CPU rank's torch recorder logging that it records nothing. The real CUDA recording:
test_profiling_cuda.py."""

from __future__ import annotations

import logging
import sys
import types

import torch

from relax.backends.trainer import memory_history as mh
from relax.backends.trainer.profiling import RankProfiler
from relax.config.observability import TrainProfileConfig


def flags(tmp_path, **kw) -> TrainProfileConfig:
    return TrainProfileConfig(record_memory_history=True, memory_snapshot_dir=str(tmp_path / "snap"), **kw)


class FakeCuda:
    """torch.cuda.memory's recording functions and the allocator's OOM observer hook, as calls."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple] = []
        self.observer = None
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                            lambda enabled="all", **kw: self.calls.append(("record", enabled, kw.get("stacks"))))
        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: self.calls.append(("dump", path)))
        monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", self.attach, raising=False)

    def attach(self, fn) -> None:
        self.observer = fn


def test_the_torch_recorder_dumps_after_the_configured_steps_and_stops(tmp_path, monkeypatch):
    cuda = FakeCuda(monkeypatch)
    rec = mh.memory_history(flags(tmp_path, memory_snapshot_num_steps=2), "actor", 1, torch.device("cuda", 0))
    rec.start()
    assert cuda.calls == [("record", "all", "all")] and cuda.observer is not None
    for step in range(4):
        rec.step_done(step)
    rec.close()
    path = str(tmp_path / "snap" / "actor_rank1_snapshot.pickle")
    assert cuda.calls[1:] == [("dump", path), ("record", None, None)]  # after step 1, once


def test_an_oom_dumps_the_history_to_its_own_file(tmp_path, monkeypatch, caplog):
    cuda = FakeCuda(monkeypatch)
    rec = mh.memory_history(flags(tmp_path, memory_snapshot_path="mem.pickle"), "critic", 0, torch.device("cuda", 0))
    rec.start()
    with caplog.at_level(logging.ERROR, logger=mh.__name__):
        cuda.observer(0, 2 << 30, 70 << 30, 1 << 30)
    assert cuda.calls[-1] == ("dump", str(tmp_path / "snap" / "critic_rank0_oom_mem.pickle"))
    assert "CUDA OOM on device 0 (asked 2.00 GiB" in caplog.text
    for step in range(5):  # without --memory-snapshot-num-steps only an OOM dumps
        rec.step_done(step)
    assert [c for c in cuda.calls if c[0] == "dump"] == [cuda.calls[-1]]


def test_the_torch_recorder_on_a_cpu_rank_records_nothing_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=mh.__name__):
        rec = mh.memory_history(flags(tmp_path), "actor", 0, torch.device("cpu"))
    assert isinstance(rec, mh.NoMemoryHistory)
    assert "needs a CUDA GPU" in caplog.text and "--memory-recorder memray" in caplog.text
    assert isinstance(mh.memory_history(TrainProfileConfig(), "actor", 0, torch.device("cpu")), mh.NoMemoryHistory)


class FakeTracker:
    """memray.Tracker: records its destination and when it is entered and left."""

    log: list[tuple] = []

    def __init__(self, *, destination, native_traces) -> None:
        self.destination, self.native_traces = destination, native_traces

    def __enter__(self):
        FakeTracker.log.append(("enter", self.destination.path, self.native_traces))
        return self

    def __exit__(self, *exc) -> None:
        FakeTracker.log.append(("exit", self.destination.path))


def test_memray_tracks_host_memory_on_a_cpu_rank_until_the_configured_step(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(Tracker=FakeTracker,
                                 FileDestination=lambda path, overwrite: types.SimpleNamespace(path=path))
    monkeypatch.setitem(sys.modules, "memray", fake)
    FakeTracker.log = []
    p = flags(tmp_path, memory_recorder="memray", memory_snapshot_num_steps=3)
    prof = RankProfiler(p, None, "actor", 0, torch.device("cpu"))  # the rank's profiler starts it
    path = str(tmp_path / "snap" / "actor_rank0_snapshot.bin")
    assert FakeTracker.log == [("enter", path, True)]
    for _ in range(4):
        prof.step_begin()
        prof.step_end()
    prof.close()
    assert FakeTracker.log == [("enter", path, True), ("exit", path)]  # after step 2, once
