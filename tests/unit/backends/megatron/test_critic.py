"""The megatron critic computes what the fsdp critic computes (fp32, gloo, real processes): on a
tiny Qwen3 critic checkpoint (a token-classification model with its `score` head), the
per-token values before and after one optimizer step on the value loss, the loss and the
gradient norm, for megatron on one rank and with CP=2 (the two rank processes of
tests/rank_pool.py) against fsdp."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import parity_cases  # noqa: E402

from relax.utils.net import free_port  # noqa: E402

ATOL_VALUE, ATOL_NORM = 1e-5, 1e-4


def critic_checkpoint(root: str) -> str:
    import torch
    from transformers import AutoModelForTokenClassification

    dense = parity_cases.make_models(root)["dense"]
    torch.manual_seed(1)
    path = os.path.join(root, "critic")
    AutoModelForTokenClassification.from_pretrained(dense, num_labels=1).save_pretrained(path)
    return path


def run(rank: int, world_size: int, port: int, backend: str, parallel: dict, path: str, out: str) -> None:
    """Values of the fixed batch, one step on the value loss, values again; written to `out.<rank>.json`."""
    from relax.backends.base import ModelParallelSpec, TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig

    spec = TrainerSpec(model_path=path, head="value", optim=OptimizerConfig(lr=1e-2, clip_grad=1.0),
                       batch=BatchConfig(micro_batch_size=2), threads=1, value_clip=0.2,
                       model_parallel=ModelParallelSpec(**parallel))
    worker = Trainer(rank, world_size, "127.0.0.1", port, dataclasses.replace(spec, backend=backend))
    b = parity_cases.batch()
    before = worker.compute_values(b.tokens_RL, b.response_lengths_R)
    b.values_RT = before
    b.returns_RT = [[0.3 * (i % 3) - 0.2 * j for j in range(n)] for i, n in enumerate(b.response_lengths_R)]
    metrics = worker.train(b, 1, [sum(map(sum, b.loss_masks_RT))])
    after = worker.compute_values(b.tokens_RL, b.response_lengths_R)
    worker.shutdown()
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump({"before": before, "after": after, "metrics": metrics}, f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, rank_pool):
    root = str(tmp_path_factory.mktemp("critic"))
    path = critic_checkpoint(root)
    port = free_port()
    job = rank_pool.submit(run, [(r, 2, port, "megatron", {"cp": 2}, path, f"{root}/cp2") for r in range(2)],
                           "a two-rank megatron critic")
    run(0, 1, free_port(), "fsdp", {}, path, f"{root}/fsdp")
    run(0, 1, free_port(), "megatron", {}, path, f"{root}/megatron")
    rank_pool.wait(job, 600)
    load = lambda name: json.load(open(f"{root}/{name}.json"))  # noqa: E731
    return {"fsdp": [load("fsdp.0")], "tp1": [load("megatron.0")], "cp2": [load("cp2.0"), load("cp2.1")]}


@pytest.mark.parametrize("layout", ["tp1", "cp2"])
def test_megatron_critic_matches_fsdp(runs, layout):
    (ref,) = runs["fsdp"]
    for got in runs[layout]:
        for key in ("before", "after"):
            for row, (a, b) in enumerate(zip(got[key], ref[key])):
                assert a == pytest.approx(b, abs=ATOL_VALUE), (key, row)
        moved = max(abs(a - b) for ra, rb in zip(got["after"], got["before"]) for a, b in zip(ra, rb))
        assert moved > 1e-3  # the step changed the values (so "after" compares trained heads)
        for key in ("value_loss", "grad_norm"):
            assert got["metrics"][key] == pytest.approx(ref["metrics"][key], abs=ATOL_NORM), key
