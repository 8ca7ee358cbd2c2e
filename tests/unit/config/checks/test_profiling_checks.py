"""The training ranks' profiling and memory flags at the command line (`relax.config.checks.profiling`):
what is an error (with the fix named), what is derived (the snapshot directory, the trace directory in
the run directory), what the plan notes (CUDA-only flags on a CPU run, targets nested in
train_overall, options without their enabling flag), and each flag's status. Their effects on a rank:
tests/unit/backends/trainer/test_trainer_profiling.py, test_memory_history.py,
tests/unit/utils/test_memory_check.py, and on CUDA test_profiling_cuda.py."""

from __future__ import annotations

import dataclasses
import os

import pytest

from relax.config import ConfigError, parse_config
from relax.config.checks import profiling
from relax.config.observability import parse_profile_target
from relax.config.plan import resolve_plan
from relax.config.schema import GROUPS
from relax.config.status import flag_status


def notes(args: list[str], gpus: float = 0.0) -> list[str]:
    return list(resolve_plan(parse_config(args), gpus).notes)


def test_the_seeds_profiling_flags_parse_with_their_defaults(base):
    cfg = parse_config(base + ["--use-pytorch-profiler", "--profile-with-stack", "--profile-with-memory",
                               "--profile-with-flops", "--profile-target", "train_actor", "train_log_probs"])
    p = cfg.train_profile
    assert (p.profile_step_start, p.profile_step_end) == (10, 12)
    assert p.profile_target == ["train_actor", "train_log_probs"]
    assert p.profile_with_stack and p.profile_with_memory and p.profile_with_flops
    assert profiling.train_trace_dir(cfg) == os.path.join(cfg.misc.exp_dir, "train_trace")
    assert profiling.train_trace_dir(parse_config(base)) is None
    assert parse_config(base).train_profile.profile_target == ["train_overall"]


def test_an_unknown_target_fails_at_parse_time_with_a_suggestion(base, capsys):
    with pytest.raises(SystemExit):
        parse_config(base + ["--use-pytorch-profiler", "--profile-target", "train_actr"])
    assert "unknown profile target 'train_actr'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="did you mean train_actor"):
        parse_profile_target("train_actr")


@pytest.mark.parametrize("flags, message", [
    (["--profile-step-start", "5", "--profile-step-end", "4"], "start <= end"),
    (["--profile-step-start", "-1"], "counted from 0"),
])
def test_a_step_window_that_selects_nothing_is_an_error(base, flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(base + ["--use-pytorch-profiler", *flags])
    parse_config(base + flags)  # without the profiler the window is inert (a note), not an error


def test_the_snapshot_directory_defaults_to_the_run_directory(base, tmp_path):
    cfg = parse_config(base + ["--record-memory-history", "--memory-snapshot-num-steps", "3"])
    assert cfg.train_profile.memory_snapshot_dir == os.path.join(cfg.misc.exp_dir, "memory_snapshot")
    given = parse_config(base + ["--record-memory-history", "--memory-snapshot-dir", "snaps"])
    assert given.train_profile.memory_snapshot_dir == os.path.abspath("snaps")


@pytest.mark.parametrize("flags, message", [
    (["--memory-snapshot-path", "dir/snapshot.pickle"], "a file name.*--memory-snapshot-dir"),
    (["--memory-snapshot-num-steps", "0"], "--memory-snapshot-num-steps 0"),
])
def test_bad_snapshot_flags_are_errors(base, flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(base + ["--record-memory-history", *flags])


def test_memray_missing_names_the_install(base, monkeypatch):
    monkeypatch.setattr(profiling, "memray_installed", lambda: False)
    with pytest.raises(ConfigError, match="pip install memray"):
        parse_config(base + ["--record-memory-history", "--memory-recorder", "memray",
                             "--memory-snapshot-num-steps", "2"])


def test_memray_needs_a_step_to_stop_at(base, monkeypatch):
    monkeypatch.setattr(profiling, "memray_installed", lambda: True)
    with pytest.raises(ConfigError, match="--memory-snapshot-num-steps N"):
        parse_config(base + ["--record-memory-history", "--memory-recorder", "memray"])
    cfg = parse_config(base + ["--record-memory-history", "--memory-recorder", "memray",
                               "--memory-snapshot-num-steps", "2"])
    assert cfg.train_profile.memory_recorder == "memray"


def test_cuda_only_flags_on_a_cpu_run_are_noted(base):
    cpu = notes(base + ["--record-memory-history", "--enable-cuda-memory-check"])
    assert any(n.startswith("--record-memory-history") and "needs a CUDA GPU" in n for n in cpu)
    assert any(n.startswith("--enable-cuda-memory-check") and "needs a CUDA" in n for n in cpu)
    gpu = notes(base + ["--record-memory-history", "--enable-cuda-memory-check"], gpus=1)
    assert not [n for n in gpu if "needs a CUDA" in n]
    assert any("only a CUDA OOM writes a snapshot" in n for n in gpu)


def test_targets_with_train_overall_are_noted_as_ranges(base):
    (note,) = [n for n in notes(base + ["--use-pytorch-profiler", "--profile-target", "train_overall",
                                        "train_log_probs"]) if n.startswith("--profile-target")]
    assert "train_log_probs" in note and "named ranges" in note


def test_options_without_their_flag_are_inert(base):
    got = notes(base + ["--profile-step-start", "1", "--profile-with-flops", "--memory-recorder", "memray",
                        "--memory-snapshot-num-steps", "2"])
    assert any("--profile-step-start" in n and "--profile-with-flops" in n and "--use-pytorch-profiler" in n
               for n in got)
    assert any("--memory-recorder" in n and "--memory-snapshot-num-steps" in n and "--record-memory-history" in n
               for n in got)


def test_each_flag_says_what_it_needs():
    fields = {f.name: f for f in dataclasses.fields(GROUPS["train_profile"])}
    for name in ("record_memory_history", "enable_cuda_memory_check"):
        status, reason = flag_status(fields[name])
        assert status == "needs" and "CUDA GPU" in reason
    status, reason = flag_status(fields["memory_recorder"])
    assert status == "needs" and "pip install memray" in reason
    acting = ("use_pytorch_profiler", "profile_step_start", "profile_step_end", "profile_target", "profile_with_stack",
              "profile_with_memory", "profile_with_flops", "memory_snapshot_path", "memory_snapshot_dir",
              "memory_snapshot_num_steps")
    assert all(flag_status(fields[name])[0] == "acts" for name in acting)
