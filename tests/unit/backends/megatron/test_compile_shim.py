"""--use-torch-compile on megatron: each decoder layer compiles to one graph (no graph breaks),
and the compiled layers compute what the plain ones do. Dynamo's tracing is the same for every
backend, so the CPU check uses the "eager" backend (no kernel compiler needed)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import parity_cases  # noqa: E402

from relax.algorithms.policy_loss import PolicyLossConfig  # noqa: E402
from relax.backends.base import TrainerSpec  # noqa: E402
from relax.config.schema import BatchConfig, OptimizerConfig  # noqa: E402
from relax.utils.net import free_port  # noqa: E402


def _step(model_path: str, compiled: bool) -> tuple[list, dict, list, int, int]:
    from torch._dynamo.utils import counters

    from relax.backends.megatron import compile_shim
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(backend="megatron", model_path=model_path,
                       optim=OptimizerConfig(lr=1e-2, clip_grad=1.0, bf16=True),
                       batch=BatchConfig(micro_batch_size=4), loss=PolicyLossConfig(), threads=1)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        counters.clear()
        if compiled:
            compile_shim.compile_layers(worker.runner.model.decoder.layers, backend="eager")
        b = parity_cases.batch()
        before = worker.compute_log_probs(b.tokens_RL, b.response_lengths_R)
        b.old_log_probs_RT = before
        metrics = worker.train(b, 1, [sum(map(len, b.loss_masks_RT))])
        after = worker.compute_log_probs(b.tokens_RL, b.response_lengths_R)
        return before, metrics, after, sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]
    finally:
        worker.shutdown()


def test_compiled_layers_are_one_graph_each_and_compute_the_same(tmp_path):
    path = parity_cases.make_models(str(tmp_path))["dense"]  # 2 decoder layers
    plain_before, plain_metrics, plain_after, _, _ = _step(path, compiled=False)
    before, metrics, after, breaks, graphs = _step(path, compiled=True)
    assert breaks == 0, f"{breaks} graph breaks in megatron's compiled decoder layers (compile_shim.py)"
    assert graphs >= 2  # the layers ran compiled (one graph each, a recompile may add more)
    for got, want in ((before, plain_before), (after, plain_after)):
        for row_got, row_want in zip(got, want):
            assert row_got == pytest.approx(row_want, abs=1e-5)
    assert metrics["grad_norm"] == pytest.approx(plain_metrics["grad_norm"], rel=1e-5)
    assert metrics["pg_loss"] == pytest.approx(plain_metrics["pg_loss"], abs=1e-6)


def test_sequence_parallel_mappings_take_the_differentiable_collective_only_while_compiling(monkeypatch):
    """compile_shim's sequence-parallel mappings (module doc): megatron's own region outside a compiled
    region and whenever it is given split sizes or a global buffer; the functional collective, over the
    given group, while compiling; the input itself over a group of one rank."""
    import torch

    from relax.backends.megatron import compile_shim

    class Group:
        def __init__(self, size: int) -> None:
            self._size = size

        def size(self) -> int:
            return self._size

    calls = []
    region = lambda x, *args, group=None, **kw: calls.append(("region", args, kw)) or x  # noqa: E731
    collective = lambda x, group: calls.append(("collective", group.size())) or x  # noqa: E731
    mapped = compile_shim._differentiable_when_compiled(region, collective)
    x, two = torch.ones(4, 1, 2), Group(2)
    mapped(x, group=two)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    mapped(x, group=two, input_split_sizes=[3, 1])
    mapped(x, group=two, use_global_buffer=True)
    mapped(x, group=two, input_split_sizes=None)
    assert mapped(x, group=Group(1)) is x
    assert calls == [("region", (), {}), ("region", (), {"input_split_sizes": [3, 1]}),
                     ("region", (), {"use_global_buffer": True}), ("collective", 2)]
