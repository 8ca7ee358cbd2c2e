"""`--use-pytorch-profiler` on a training rank (relax.backends.trainer.profiling.RankProfiler), on CPU:
a trace (and its summary table) is written for exactly the steps --profile-step-start..--profile-step-end,
per --profile-target (the whole step, the training passes, the log-prob passes); targets inside a
train_overall window are named ranges of its trace; --profile-with-stack/memory/flops show in what is
written; nothing happens outside a step or with the flag off. The last test runs a whole fsdp Trainer
rank (in-process, world size 1, gloo) through marked steps. The CUDA side: test_profiling_cuda.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relax.backends.trainer.profiling import RankProfiler
from relax.config.observability import TrainProfileConfig
from profiled_steps import run_profiled_steps

CPU = torch.device("cpu")


def profiler(tmp_path: Path, **flags) -> RankProfiler:
    p = TrainProfileConfig(use_pytorch_profiler=True, **flags)
    return RankProfiler(p, str(tmp_path / "train_trace"), "actor", 0, CPU)


def work() -> None:
    a = torch.randn(16, 16)
    (a @ a).sum()


def run_steps(prof: RankProfiler, steps: int, *passes: str) -> None:
    """`steps` marked steps, each a matmul and then the passes named (a matmul each), in order."""
    for _ in range(steps):
        prof.step_begin()
        work()
        for name in passes:
            with prof.target(name):
                work()
        prof.step_end()


def traces(root: Path) -> list[str]:
    """The trace files under `root`, as <role>/<target>/<file> (sorted)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.pt.trace.json.gz"))


def events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_a_trace_is_written_for_exactly_the_configured_steps(tmp_path):
    prof = profiler(tmp_path, profile_step_start=1, profile_step_end=2)
    run_steps(prof, 5)
    root = tmp_path / "train_trace"
    assert traces(root) == ["actor/train_overall/rank0_step1.pt.trace.json.gz",
                            "actor/train_overall/rank0_step2.pt.trace.json.gz"]
    assert (root / "actor/train_overall/rank0_step1.txt").read_text().count("Self CPU") >= 1
    assert prof.step == 4


def test_targets_profile_only_their_passes(tmp_path):
    prof = profiler(tmp_path, profile_step_start=0, profile_step_end=0, profile_target=["train_actor"])
    run_steps(prof, 2, "train_log_probs", "train_actor")
    assert traces(tmp_path / "train_trace") == ["actor/train_actor/rank0_step0.pt.trace.json.gz"]


def test_the_log_prob_and_training_targets_get_a_trace_each(tmp_path):
    prof = profiler(tmp_path, profile_step_start=0, profile_step_end=0,
                    profile_target=["train_actor", "train_log_probs"])
    run_steps(prof, 1, "train_log_probs", "train_log_probs", "train_actor")
    assert traces(tmp_path / "train_trace") == [  # the reference log-probs after the old ones: a second file
        "actor/train_actor/rank0_step0.pt.trace.json.gz", "actor/train_log_probs/rank0_step0.pt.trace.json.gz",
        "actor/train_log_probs/rank0_step0_1.pt.trace.json.gz"]


def test_inside_a_train_overall_window_other_targets_are_named_ranges(tmp_path):
    prof = profiler(tmp_path, profile_step_start=0, profile_step_end=0,
                    profile_target=["train_overall", "train_actor", "train_log_probs"])
    run_steps(prof, 1, "train_log_probs", "train_actor")
    (trace,) = (tmp_path / "train_trace").rglob("*.pt.trace.json.gz")
    assert trace.parent.name == "train_overall"
    names = {e.get("name") for e in events(trace)}
    assert {"train_actor", "train_log_probs", "aten::mm"} <= names


def test_passes_outside_a_step_and_a_disabled_profiler_write_nothing(tmp_path):
    prof = profiler(tmp_path, profile_step_start=0, profile_step_end=5, profile_target=["train_log_probs"])
    with prof.target("train_log_probs"):  # before the role's first step
        work()
    off = RankProfiler(TrainProfileConfig(profile_step_start=0), str(tmp_path / "off"), "actor", 0, CPU)
    run_steps(off, 2, "train_log_probs")
    assert not (tmp_path / "train_trace").exists() and not (tmp_path / "off").exists()


@pytest.mark.parametrize("flag, needle", [
    ("profile_with_stack", "python_function"), ("profile_with_memory", "cpu_instant_event"),
])
def test_stack_and_memory_options_add_their_events(tmp_path, flag, needle):
    def categories(root: Path, **flags) -> set:
        prof = profiler(root, profile_step_start=0, profile_step_end=0, **flags)
        run_steps(prof, 1)
        (trace,) = root.rglob("*.pt.trace.json.gz")
        return {e.get("cat") for e in events(trace)}

    assert needle in categories(tmp_path / "with", **{flag: True})
    assert needle not in categories(tmp_path / "without")


def test_flops_show_in_the_summary_table(tmp_path):
    prof = profiler(tmp_path, profile_step_start=0, profile_step_end=0, profile_with_flops=True)
    run_steps(prof, 1)
    (table,) = (tmp_path / "train_trace").rglob("*.txt")
    assert "FLOPs" in table.read_text()


def test_close_writes_a_window_still_open(tmp_path):
    prof = profiler(tmp_path, profile_step_start=0, profile_step_end=0)
    prof.step_begin()
    work()
    prof.close()
    assert traces(tmp_path / "train_trace") == ["actor/train_overall/rank0_step0.pt.trace.json.gz"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("m")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                                 pad_token_id=0)).save_pretrained(path)
    return str(path)


def test_a_trainer_rank_profiles_its_marked_steps(model_path, tmp_path):
    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig
    from relax.types import TrainBatch
    from relax.utils.net import free_port

    profile = TrainProfileConfig(use_pytorch_profiler=True, profile_step_start=1, profile_step_end=1,
                                 profile_target=["train_actor", "train_log_probs"])
    spec = TrainerSpec(model_path=model_path, optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=2),
                       loss=PolicyLossConfig(), threads=1, total_steps=3, name="actor", profile=profile,
                       trace_dir=str(tmp_path / "train_trace"))
    w = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    lengths = [2, 3]
    b = TrainBatch(tokens_RL=[[1, 2, 3, 4], [3, 4, 5, 6, 7]], response_lengths_R=lengths,
                   loss_masks_RT=[[1] * n for n in lengths], advantages_RT=[[1.0] * 2, [-1.0] * 3])
    try:
        run_profiled_steps(w, b)
    finally:
        w.shutdown()
    root = tmp_path / "train_trace"
    assert traces(root) == ["actor/train_actor/rank0_step1.pt.trace.json.gz",
                            "actor/train_log_probs/rank0_step1.pt.trace.json.gz"]
    assert "aten::mm" in {e.get("name") for e in events(root / "actor/train_actor/rank0_step1.pt.trace.json.gz")}


class FakeRank:
    """A rank handle whose remote methods only record their names."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=lambda: self.calls.append(name))


class FakeRanks:
    """RayActorGroup.on_all over two fake ranks."""

    def __init__(self, calls: list[str]) -> None:
        self.ranks = [FakeRank(calls), FakeRank(calls)]

    async def on_all(self, call):
        return [call(rank) for rank in self.ranks]


@pytest.mark.parametrize("flags, expected", [
    ({}, ["body"]),
    ({"use_pytorch_profiler": True}, ["profile_step_begin"] * 2 + ["body"] + ["profile_step_end"] * 2),
    ({"record_memory_history": True}, ["profile_step_begin"] * 2 + ["body"] + ["profile_step_end"] * 2),
])
def test_a_role_marks_its_steps_on_every_rank_only_when_profiling(flags, expected):
    import asyncio

    from relax.backends.base import TrainerSpec
    from relax.backends.trainer.group import TrainerGroup

    calls: list[str] = []
    group = object.__new__(TrainerGroup)  # no Ray: the ranks are fakes
    group.spec, group.ranks = TrainerSpec(model_path="m", profile=TrainProfileConfig(**flags)), FakeRanks(calls)

    async def step() -> None:
        async with group.profiled_step():
            calls.append("body")

    asyncio.run(step())
    assert calls == expected


def test_the_flags_reach_the_rank_spec_from_the_command_line(base, monkeypatch):
    from relax.components import training
    from relax.config import parse_config
    from relax.config.plan import resolve_plan

    cfg = parse_config(base + ["--use-pytorch-profiler", "--profile-step-start", "0", "--profile-step-end", "1",
                               "--profile-target", "train_actor", "--enable-cuda-memory-check"])
    monkeypatch.setattr(training, "TrainerGroup", lambda spec, workers, **kw: spec)
    spec = training.make_trainer_group(cfg, resolve_plan(cfg).actor.role, "model")
    assert spec.profile == cfg.train_profile and spec.profile.profile_target == ["train_actor"]
    assert spec.trace_dir == str(Path(cfg.misc.exp_dir) / "train_trace")
