"""The optimizer-placement and overlap flags at the command line (`relax.config.checks.optimizer`):
what is an error, and what the plan says where a flag does less than its name (a CPU run's copies,
fsdp's built-in overlap, offload without the distributed optimizer). The flags' effects are tested
in tests/unit/backends/trainer/test_host_optimizer.py, test_lowp_adam.py,
tests/unit/backends/megatron/test_grad_overlap.py and test_parity.py."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config
from relax.config.checks.megatron import MEGATRON_NOT_BUILT
from relax.config.plan import resolve_plan

SEED_FLAGS = ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]


def notes(args: list[str], gpus: float = 0.0) -> list[str]:
    return list(resolve_plan(parse_config(args), gpus).notes)


def test_the_seeds_optimizer_flags_parse_on_both_backends(base):
    for backend in ("fsdp", "megatron"):
        if backend == "megatron":
            pytest.importorskip("megatron.core")
        cfg = parse_config(base + ["--train-backend", backend, *SEED_FLAGS])
        assert cfg.optim.optimizer_cpu_offload and cfg.optim.use_precision_aware_optimizer
    for name in ("optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer",
                 "overlap_grad_reduce", "overlap_param_gather"):
        assert name not in MEGATRON_NOT_BUILT


def test_a_cpu_run_says_its_offload_copies_are_plain_copies(base):
    (note,) = [n for n in notes(base + SEED_FLAGS) if n.startswith("--optimizer-cpu-offload")]
    assert "--overlap-cpu-optimizer-d2h-h2d: on CPU" in note and "chunked step schedule still runs" in note
    assert not [n for n in notes(base + SEED_FLAGS, gpus=1) if "on CPU the optimizer" in n]


def test_the_overlap_copies_flag_alone_is_inert(base):
    assert any(n.startswith("--overlap-cpu-optimizer-d2h-h2d") and "--optimizer-cpu-offload" in n
               for n in notes(base + ["--overlap-cpu-optimizer-d2h-h2d"]))


def test_fsdp_states_it_overlaps_already(base):
    (note,) = [n for n in notes(base + ["--train-backend", "fsdp", "--overlap-grad-reduce", "--overlap-param-gather"])
               if "overlaps always" in n]
    assert note.startswith("--overlap-grad-reduce --overlap-param-gather: fsdp overlaps always")


def test_param_gather_needs_grad_reduce_and_under_megatron_the_distributed_optimizer(base):
    with pytest.raises(ConfigError, match="--overlap-param-gather requires --overlap-grad-reduce"):
        parse_config(base + ["--overlap-param-gather"])
    pytest.importorskip("megatron.core")
    megatron = base + ["--train-backend", "megatron", "--overlap-grad-reduce", "--overlap-param-gather"]
    with pytest.raises(ConfigError, match="add --use-distributed-optimizer"):
        parse_config(megatron)
    assert parse_config(megatron + ["--use-distributed-optimizer"]).optim.overlap_param_gather


def test_megatron_offload_without_the_distributed_optimizer_is_allowed_and_noted(base):
    pytest.importorskip("megatron.core")
    args = base + ["--train-backend", "megatron", "--optimizer-cpu-offload"]
    assert any("whole optimizer state on its host" in n for n in notes(args))
    assert not any("whole optimizer state" in n for n in notes(args + ["--use-distributed-optimizer"]))
