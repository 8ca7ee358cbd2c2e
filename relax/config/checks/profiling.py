"""The training ranks' profiling and memory flags (`TrainProfileConfig`), before Ray starts.

`check_train_profile` (after the run directory is resolved) rejects what could not act: a step
window that selects no step, an empty target list, a snapshot name with a directory in it, memray
missing or without a step to stop at. It returns the config with `--memory-snapshot-dir` resolved
(default `<exp-dir>/memory_snapshot`, absolute: the ranks do not share the launch directory).

`train_profile_notes` (plan notes, printed by `--dry-run` and logged at start) says what a CUDA-only
flag does where the plan puts the training ranks on CPU (nothing), and how targets nest inside a
train_overall window. The flags act in each rank: `relax.backends.trainer.profiling`.
"""

from __future__ import annotations

import importlib.util
import os

from relax.config.errors import ConfigError
from relax.config.observability import TrainProfileConfig
from relax.config.schema import RelaxConfig

TRACE_SUBDIR = "train_trace"  # <exp-dir>/train_trace/<role>/<target>/rank<r>_step<k>.pt.trace.json.gz
SNAPSHOT_SUBDIR = "memory_snapshot"


def train_trace_dir(cfg: RelaxConfig) -> str | None:
    """Where the training ranks write torch profiler traces (None: --use-pytorch-profiler is off)."""
    if not cfg.train_profile.use_pytorch_profiler:
        return None
    return os.path.join(os.path.abspath(cfg.misc.exp_dir or "."), TRACE_SUBDIR)


def memray_installed() -> bool:
    """memray is on this Python's path (found, not imported)."""
    return importlib.util.find_spec("memray") is not None


def _check_profiler(p: TrainProfileConfig) -> None:
    if p.profile_step_start < 0 or p.profile_step_end < p.profile_step_start:
        raise ConfigError(f"--profile-step-start {p.profile_step_start} / --profile-step-end {p.profile_step_end}: "
                          "both are steps counted from 0 since this launch, inclusive, with start <= end (start 10, "
                          "end 12 profiles steps 10, 11 and 12)")
    if not p.profile_target:
        raise ConfigError("--profile-target is empty: name one or more of train_overall, train_actor, train_log_probs")


def _check_memory(p: TrainProfileConfig) -> None:
    if os.path.dirname(p.memory_snapshot_path):
        raise ConfigError(f"--memory-snapshot-path {p.memory_snapshot_path}: a file name (each rank prefixes it with "
                          "its role and rank); give the directory with --memory-snapshot-dir")
    if p.memory_snapshot_num_steps is not None and p.memory_snapshot_num_steps < 1:
        raise ConfigError(f"--memory-snapshot-num-steps {p.memory_snapshot_num_steps}: the snapshot is dumped after "
                          "that many steps (>= 1; 3 dumps after step 2)")
    if p.memory_recorder != "memray":
        return
    if not memray_installed():
        raise ConfigError("--memory-recorder memray: the memray package is not installed (it is not a dependency of "
                          "this project): pip install memray, or use --memory-recorder torch (CUDA allocations)")
    if p.memory_snapshot_num_steps is None:
        raise ConfigError("--memory-recorder memray writes its capture when tracking stops: set "
                          "--memory-snapshot-num-steps N to stop after N steps")


def check_train_profile(cfg: RelaxConfig) -> RelaxConfig | None:
    """The profiling flags that are on; returns the config with the snapshot directory resolved."""
    p = cfg.train_profile
    if p.use_pytorch_profiler:
        _check_profiler(p)
    if not p.record_memory_history:
        return None
    _check_memory(p)
    snapshots = p.memory_snapshot_dir or os.path.join(cfg.misc.exp_dir or ".", SNAPSHOT_SUBDIR)
    return cfg.replace(memory_snapshot_dir=os.path.abspath(snapshots))


def train_profile_notes(cfg: RelaxConfig, device: str) -> list[str]:
    """Plan notes: CUDA-only flags on a CPU run, a history only an OOM dumps, targets inside a train_overall
    window."""
    p, notes = cfg.train_profile, []
    if device == "cpu" and p.record_memory_history and p.memory_recorder == "torch":
        notes.append("--record-memory-history: CUDA memory history needs a CUDA GPU and this run's training ranks are "
                     "on CPU: no snapshot is recorded (--memory-recorder memray records host memory on CPU)")
    elif p.record_memory_history and p.memory_recorder == "torch" and p.memory_snapshot_num_steps is None:
        notes.append("--record-memory-history without --memory-snapshot-num-steps: only a CUDA OOM writes a snapshot "
                     "(set --memory-snapshot-num-steps N for one after N steps)")
    if device == "cpu" and p.enable_cuda_memory_check:
        notes.append("--enable-cuda-memory-check: it logs free GPU memory before each collective, which needs a CUDA "
                     "GPU; this run's training ranks are on CPU: no effect")
    inner = [t for t in p.profile_target if t != "train_overall"]
    if p.use_pytorch_profiler and "train_overall" in p.profile_target and inner:
        notes.append(f"--profile-target {' '.join(inner)} with train_overall: one torch profiler records per process "
                     "at a time, so these are named ranges of each step's train_overall trace, not traces of their own")
    return notes
