"""A training rank's profiling: torch profiler traces of selected steps, memory history, memory checks.

The role brackets each of its steps on its ranks (`TrainerGroup.profiled_step`, which calls
`Trainer.profile_step_begin` / `profile_step_end`); a rank counts them from 0 since this launch
(not the rollout id: a resumed run counts from 0 again). The roles that mark steps: the Actor (its
whole `train` step: old / reference log-probs and training passes), the Critic (its training; its
value passes run outside its steps and are not profiled), the Reference and ActorFwd (each step's
scoring). In the steps `--profile-step-start`..`--profile-step-end` (inclusive) each
`--profile-target` is a window of its own torch profiler:
    train_overall    the role's whole step on this rank (between the step's two markers)
    train_actor      the training passes (`Trainer.train`, or `train_begin` .. `train_end`)
    train_log_probs  the forward-only passes: old / reference log-probs, a critic's values
Kineto runs one profiler per process at a time, so inside a train_overall window the other
targets are named ranges of its trace (`record_function`) instead of traces of their own.
Activities: CPU ops, and CUDA kernels on a GPU rank; shapes always, stacks / memory / FLOPs with
`--profile-with-stack`, `--profile-with-memory`, `--profile-with-flops`.

Each window is written when it ends to `<trace dir>/<role>/<target>/rank<r>_step<k>.pt.trace.json.gz`
(a second window of the same target in one step, e.g. the reference log-probs after the old
ones: `rank<r>_step<k>_1...`), a Chrome trace that Perfetto (ui.perfetto.dev) opens and that
TensorBoard's profiler plugin reads (`tensorboard --logdir <trace dir>`: one run per role/target),
next to a `.txt` table of the ops by self time (with their FLOPs under `--profile-with-flops`).

The same object starts the rank's memory history (`memory_history.py`) and turns on the collective
memory check of `--enable-cuda-memory-check` (`relax.utils.memory_check`; CUDA only, a CPU rank
logs that it does nothing). With none of the flags set every call here does nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch

from relax.backends.trainer.memory_history import memory_history
from relax.config.observability import TrainProfileConfig
from relax.utils import memory_check

logger = logging.getLogger(__name__)

OVERALL = "train_overall"
SUMMARY_ROWS = 40


class RankProfiler:
    """One rank's profiling (module doc). `trace_dir`: where traces go (None: no torch profiler)."""

    def __init__(self, p: TrainProfileConfig, trace_dir: str | None, role: str, rank: int,
                 device: torch.device) -> None:
        self.p, self.rank, self.device = p, rank, device
        self.dir = Path(trace_dir) / role if trace_dir is not None and p.use_pytorch_profiler else None
        self.targets = frozenset(p.profile_target) if self.dir is not None else frozenset()
        self.steps = range(p.profile_step_start, p.profile_step_end + 1)
        self.step = -1  # the step begun last, from 0 since this launch (-1: none yet)
        self.in_step = False  # between a step's markers (a pass outside every step is not profiled)
        self._recording: tuple[str, Any] | None = None  # (target, torch.profiler.profile) of the open window
        self._ranges: dict[str, Any] = {}  # target -> its record_function range inside the open window
        self._windows: Counter[tuple[str, int]] = Counter()  # (target, step) -> windows written
        self.written: list[Path] = []
        self.memory = memory_history(p, role, rank, device)
        self.memory.start()
        _start_memory_check(p.enable_cuda_memory_check, role, rank, device)

    # ---- what the Trainer calls --------------------------------------------------------------
    def step_begin(self) -> None:
        self.step, self.in_step = self.step + 1, True
        self.begin(OVERALL)

    def step_end(self) -> None:
        self.end(OVERALL)
        self.in_step = False
        self.memory.step_done(self.step)

    @contextlib.contextmanager
    def target(self, name: str) -> Iterator[None]:
        """A pass of target `name` (train_actor, train_log_probs) runs inside."""
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def begin(self, name: str) -> None:
        """Target `name` starts: a window of its own in a selected step, a range inside an open one."""
        if name not in self.targets or not self.in_step or self.step not in self.steps:
            return
        if self._recording is None:
            self._recording = (name, self._start())
        elif name != self._recording[0] and name not in self._ranges:
            self._ranges[name] = torch.profiler.record_function(name).__enter__()

    def end(self, name: str) -> None:
        if name in self._ranges:
            self._ranges.pop(name).__exit__(None, None, None)
        elif self._recording is not None and self._recording[0] == name:
            (_, profile), self._recording = self._recording, None
            profile.stop()
            self._write(name, profile)

    def close(self) -> None:
        """The rank shuts down: an open window is written, the memory history stopped, the check off."""
        for name in list(self._ranges):
            self.end(name)
        if self._recording is not None:
            self.end(self._recording[0])
        self.memory.close()
        memory_check.disable()

    # ---- torch.profiler ----------------------------------------------------------------------
    def _start(self) -> Any:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        p = self.p
        profile = torch.profiler.profile(activities=activities, record_shapes=True, with_stack=p.profile_with_stack,
                                         profile_memory=p.profile_with_memory, with_flops=p.profile_with_flops)
        profile.start()
        return profile

    def _write(self, name: str, profile: Any) -> None:
        """The window's Chrome trace and its summary table (module doc)."""
        n = self._windows[(name, self.step)]
        self._windows[(name, self.step)] += 1
        stem = f"rank{self.rank}_step{self.step}" + (f"_{n}" if n else "")
        out = self.dir / name
        out.mkdir(parents=True, exist_ok=True)
        trace = out / f"{stem}.pt.trace.json.gz"
        profile.export_chrome_trace(str(trace))
        sort = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        (out / f"{stem}.txt").write_text(profile.key_averages().table(sort_by=sort, row_limit=SUMMARY_ROWS) + "\n")
        self.written.append(trace)
        logger.info("torch profiler trace of %s, step %d: %s", name, self.step, trace)


def _start_memory_check(on: bool, role: str, rank: int, device: torch.device) -> None:
    """--enable-cuda-memory-check: this process's collectives log and annotate GPU memory (CUDA only)."""
    if not on:
        return
    if device.type != "cuda":
        logger.warning("--enable-cuda-memory-check: it reads free GPU memory, which needs a CUDA GPU; %s rank %d "
                       "runs on %s: no effect", role, rank, device.type)
        return
    memory_check.enable(memory_check.cuda_memory(device))
