"""`--record-memory-history`: a training rank's allocation history, by `--memory-recorder`.

    torch   CUDA allocations and frees with their stacks (torch.cuda.memory._record_memory_history),
            from the rank's start: `<dir>/<role>_rank<r>_<--memory-snapshot-path>` is dumped after
            step `--memory-snapshot-num-steps` - 1 (steps counted from 0 since this launch) and
            recording stops; on a CUDA OOM (an observer of the allocator) the history up to it is
            dumped to `<role>_rank<r>_oom_<name>`. Open either at https://pytorch.org/memory_viz.
            CUDA only: a CPU rank logs that it records nothing.
    memray  the rank process's host allocations with native stacks (memray.Tracker), from the
            rank's start until that step, or until the rank shuts down:
            `<dir>/<role>_rank<r>_<name stem>.bin` (`memray flamegraph <file>`). memray is not a
            dependency of this project (`pip install memray`; the config check says so first).

`memory_history` picks the recorder; a rank without the flag gets `NoMemoryHistory`, which does nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import torch

from relax.config.observability import TrainProfileConfig

logger = logging.getLogger(__name__)

MAX_ENTRIES = 1_000_000  # allocation events kept (a ring buffer): Megatron's and slime's choice


class MemoryHistory(Protocol):
    def start(self) -> None: ...
    def step_done(self, step: int) -> None: ...  # step `step` (from 0 since this launch) has ended
    def close(self) -> None: ...


class NoMemoryHistory:
    """Nothing recorded (the flag is off, or a CUDA recorder on a CPU rank)."""

    def start(self) -> None:
        """Nothing to record."""

    def step_done(self, step: int) -> None:
        """Nothing to dump."""

    def close(self) -> None:
        """Nothing to stop."""


class TorchMemoryHistory:
    """CUDA memory history (module doc): dumped to `path` after step `stop_after - 1`, to `oom_path` on OOM."""

    def __init__(self, path: Path, oom_path: Path, stop_after: int | None) -> None:
        self.path, self.oom_path, self.stop_after = path, oom_path, stop_after
        self.recording = False

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="all")
        torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
        self.recording = True
        logger.info("recording CUDA memory history; snapshot: %s%s", self.path,
                    "" if self.stop_after is None else f" after step {self.stop_after - 1}")

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """The allocator is about to raise OutOfMemoryError: the history up to it, for memory_viz."""
        logger.error("CUDA OOM on device %d (asked %.2f GiB; %.2f GiB allocated, %.2f GiB free): memory snapshot "
                     "-> %s", device, alloc / 2**30, device_alloc / 2**30, device_free / 2**30, self.oom_path)
        torch.cuda.memory._dump_snapshot(str(self.oom_path))

    def step_done(self, step: int) -> None:
        if self.recording and self.stop_after is not None and step == self.stop_after - 1:
            torch.cuda.memory._dump_snapshot(str(self.path))
            self.close()
            logger.info("CUDA memory snapshot after step %d: %s", step, self.path)

    def close(self) -> None:
        if self.recording:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False


class MemrayHistory:
    """memray's capture of host allocations (module doc), written when tracking stops."""

    def __init__(self, path: Path, stop_after: int | None) -> None:
        self.path, self.stop_after = path, stop_after
        self._tracker: Any = None

    def start(self) -> None:
        import memray  # not a dependency: checked with the config (--memory-recorder memray)

        self._tracker = memray.Tracker(destination=memray.FileDestination(str(self.path), overwrite=True),
                                       native_traces=True)
        self._tracker.__enter__()
        logger.info("memray records this rank's host allocations into %s", self.path)

    def step_done(self, step: int) -> None:
        if self.stop_after is not None and step == self.stop_after - 1:
            self.close()

    def close(self) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.__exit__(None, None, None)
            logger.info("memray capture written: %s", self.path)


def memory_history(p: TrainProfileConfig, role: str, rank: int, device: torch.device) -> MemoryHistory:
    """The recorder of one rank (`role`, `rank`) on `device`, by the flags (not started yet)."""
    if not p.record_memory_history:
        return NoMemoryHistory()
    if p.memory_recorder == "torch" and device.type != "cuda":
        logger.warning("--record-memory-history: CUDA memory history needs a CUDA GPU; %s rank %d runs on %s, so "
                       "nothing is recorded (--memory-recorder memray records host memory)", role, rank, device.type)
        return NoMemoryHistory()
    directory = Path(p.memory_snapshot_dir or "memory_snapshot")
    directory.mkdir(parents=True, exist_ok=True)
    prefix = f"{role}_rank{rank}_"
    if p.memory_recorder == "memray":
        return MemrayHistory(directory / (prefix + Path(p.memory_snapshot_path).stem + ".bin"),
                             p.memory_snapshot_num_steps)
    return TorchMemoryHistory(directory / (prefix + p.memory_snapshot_path),
                              directory / f"{prefix}oom_{p.memory_snapshot_path}", p.memory_snapshot_num_steps)
