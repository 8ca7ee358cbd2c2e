"""A megatron rank resumed from its checkpoint continues exactly as the uninterrupted rank does
(model, optimizer state, LR schedule, RNG), and a checkpoint of another layout is refused. With
--async-save the rank file is written in the background from a host copy taken at the save."""

from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import parity_cases  # noqa: E402

from relax.algorithms.policy_loss import PolicyLossConfig  # noqa: E402
from relax.backends.base import ModelParallelSpec, TrainerSpec  # noqa: E402
from relax.config.schema import BatchConfig, OptimizerConfig  # noqa: E402
from relax.utils import checkpoints  # noqa: E402
from relax.utils.net import free_port  # noqa: E402


def worker(path: str, **parallel):
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(backend="megatron", model_path=path,
                       optim=OptimizerConfig(lr=1e-2, lr_warmup_iters=2, lr_decay_style="cosine"),
                       batch=BatchConfig(micro_batch_size=2), loss=PolicyLossConfig(), threads=1, total_steps=6,
                       model_parallel=ModelParallelSpec(**parallel))
    return Trainer(0, 1, "127.0.0.1", free_port(), spec)


def step(w) -> dict[str, float]:
    b = parity_cases.batch()
    b.old_log_probs_RT = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
    return w.train(b, 1, [sum(map(sum, b.loss_masks_RT))])


def test_resume_equals_uninterrupted(tmp_path):
    path = parity_cases.make_models(str(tmp_path))["moe"]
    w = worker(path)
    step(w)
    w.save(str(tmp_path / "ckpt"), 0)
    assert checkpoints.trainer_part_missing(tmp_path / "ckpt") == []
    uninterrupted = [step(w), step(w)]
    w.shutdown()

    w = worker(path)
    assert w.load(str(tmp_path / "ckpt"))["rollout_id"] == 0
    resumed = [step(w), step(w)]
    w.shutdown()
    for a, b in zip(uninterrupted, resumed):
        for key in ("pg_loss", "grad_norm", "lr", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), key

    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    (tmp_path / "ckpt" / "meta.json").write_text(json.dumps({**meta, "ep": 2, "world_size": 2}))
    assert checkpoints.trainer_part_missing(tmp_path / "ckpt")  # 1 of 2 rank files
    w = worker(path)
    try:
        with pytest.raises(ValueError, match="resume with the same layout"):
            w.load(str(tmp_path / "ckpt"))
    finally:
        w.shutdown()


def test_bf16_computes_in_bf16_and_steps_float32_main_weights(tmp_path):
    """--bf16: bfloat16 model weights, float32 main weights the optimizer steps, gradients
    accumulated into them in float32; the step's log-probs stay within bf16 reach of float32."""
    import torch

    from relax.backends.trainer.trainer import Trainer

    path = parity_cases.make_models(str(tmp_path))["dense"]
    spec = TrainerSpec(backend="megatron", model_path=path, optim=OptimizerConfig(lr=1e-2, bf16=True),
                       batch=BatchConfig(micro_batch_size=2), loss=PolicyLossConfig(), threads=1)
    w = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        assert {p.dtype for p in w.runner.model.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in w.optimizer.param_groups[0]["params"]} == {torch.float32}
        before = {n: m.detach().clone() for n, m in w.runner.r.main.items()}
        metrics = step(w)
        assert metrics["grad_norm"] > 0 and all(p.grad is None for p in w.runner.model.parameters())
        moved = [n for n, m in w.runner.r.main.items() if not torch.equal(m, before[n])]
        model, main = w.runner.model, w.runner.r.main
        assert moved and all(torch.equal(model.get_parameter(n), main[n].to(torch.bfloat16)) for n in moved)
        exported = dict((n, t) for n, t, _ in w.runner.hf_state(torch.float32))
        assert exported["model.norm.weight"].dtype == torch.float32
    finally:
        w.shutdown()


def test_reference_takes_the_actors_weights_from_a_checkpoint_of_more_data_parallel_ranks(tmp_path):
    """--ref-update-interval: a rank loads the weights of the Actor's save whatever its data-parallel
    size (its lowest copy of the same shards); another model-parallel layout is refused."""
    import torch

    path = parity_cases.make_models(str(tmp_path))["moe"]
    w = worker(path)
    step(w)
    w.save(str(tmp_path / "ckpt"), 0)
    trained = {n: p.detach().clone() for n, p in w.runner.model.named_parameters()}
    w.shutdown()
    ckpt = tmp_path / "ckpt"
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "world_size": 4}))  # as if saved by 4 data-parallel ranks
    for d in (2, 11):
        (ckpt / "model" / f"tp0_pp0_ep0_dp{d}.pt").write_bytes(b"not read")

    w = worker(path)
    try:
        w.load_weights(str(ckpt))
        assert all(torch.equal(p, trained[n]) for n, p in w.runner.model.named_parameters())
        (ckpt / "meta.json").write_text(json.dumps({**meta, "tp": 2}))
        with pytest.raises(ValueError, match="give them the same model-parallel layout"):
            w.load_weights(str(ckpt))
    finally:
        w.shutdown()


def test_async_save_writes_the_state_of_the_save_while_training_goes_on(tmp_path, monkeypatch):
    """--async-save: `save(background=True)` returns before the rank file is written (an injected
    gate holds the write back), the next step trains meanwhile, and the file then holds the state of
    the save: the host copy, not the weights the step changed."""
    import threading

    import torch

    path = parity_cases.make_models(str(tmp_path))["dense"]
    w = worker(path)
    try:
        gate, snapshot = threading.Event(), w.runner.snapshot_state

        def gated(*args):
            extra, write = snapshot(*args)
            return extra, lambda: (gate.wait(60), write())

        monkeypatch.setattr(w.runner, "snapshot_state", gated)
        step(w)
        at_save = {n: t.clone() for n, t in w.runner.model.state_dict().items() if isinstance(t, torch.Tensor)}
        w.save(str(tmp_path / "ckpt"), 0, background=True)
        assert not list((tmp_path / "ckpt" / "model").glob("*.pt"))  # not written yet
        step(w)
        gate.set()
        w.wait_saved()
        assert checkpoints.trainer_part_missing(tmp_path / "ckpt") == []
        saved = torch.load(next((tmp_path / "ckpt" / "model").glob("*.pt")), weights_only=False)["model"]
        assert all(torch.equal(saved[n], t) for n, t in at_save.items())
        assert any(not torch.equal(w.runner.model.state_dict()[n], t) for n, t in at_save.items())
    finally:
        w.shutdown()
