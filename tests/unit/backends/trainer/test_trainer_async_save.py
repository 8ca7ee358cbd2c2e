"""--async-save on a Trainer rank (fsdp runner in-process, world size 1, gloo): `save(background=True)`
returns once the state is copied to the host, training goes on while it is written, the part is whole
(meta.json, written last) only after the write, and it holds the state of the save, not of the steps
after it. A failed write is raised at the next save (or `wait_saved`), never lost.

The write is held back by an injected gate rather than timed: the test decides when it ends."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed.ray.actor_group import free_port
from relax.types import TrainBatch
from relax.utils import checkpoints


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from relax.backends.trainer.trainer import Trainer

    path = tmp_path_factory.mktemp("m")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 pad_token_id=0)).save_pretrained(path)
    spec = TrainerSpec(model_path=str(path), optim=OptimizerConfig(lr=1e-2), batch=BatchConfig(micro_batch_size=2),
                       loss=PolicyLossConfig(), threads=1)
    w = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    with torch.no_grad():  # weights loaded from safetensors are memory-mapped: give them their own storage
        for p in w.runner.model.parameters():
            p.data = p.data.clone()
    yield w
    w.shutdown()


def train_step(w) -> None:
    b = TrainBatch(tokens_RL=[[1, 2, 3, 4, 5], [1, 2, 6, 7]], response_lengths_R=[2, 2],
                   loss_masks_RT=[[1, 1], [1, 1]], advantages_RT=[[1.0, 1.0], [-1.0, -1.0]])
    b.old_log_probs_RT = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
    w.train(b, 1, [4])


def gate_writes(monkeypatch, w, *, fail: Exception | None = None) -> threading.Event:
    """Each background write ends only once the returned event is set (and then raises `fail`)."""
    gate = threading.Event()
    snapshot = w.runner.snapshot_state

    def gated(*args):
        extra, write = snapshot(*args)

        def slow_write() -> None:
            assert gate.wait(60), "the test never released the write"
            write()
            if fail is not None:
                raise fail

        return extra, slow_write

    monkeypatch.setattr(w.runner, "snapshot_state", gated)
    return gate


def weights(w) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in w.runner.model.named_parameters()}


def test_async_save_returns_before_the_write_and_keeps_the_saved_state(worker, tmp_path, monkeypatch):
    gate = gate_writes(monkeypatch, worker)
    at_save = weights(worker)
    worker.save(str(tmp_path / "ckpt"), 5, background=True)
    assert not (tmp_path / "ckpt" / "meta.json").exists()  # returned with the write still held back
    train_step(worker)  # training goes on meanwhile
    assert any(not torch.equal(p, at_save[n]) for n, p in weights(worker).items())
    gate.set()
    worker.wait_saved()
    assert json.loads((tmp_path / "ckpt" / "meta.json").read_text())["rollout_id"] == 5
    assert checkpoints.trainer_part_missing(tmp_path / "ckpt") == []
    worker.load(str(tmp_path / "ckpt"))
    assert all(torch.equal(p, at_save[n]) for n, p in weights(worker).items())  # the state of the save


def test_a_failed_background_write_is_raised_at_the_next_save(worker, tmp_path, monkeypatch):
    gate = gate_writes(monkeypatch, worker, fail=OSError("No space left on device"))
    worker.save(str(tmp_path / "a"), 1, background=True)
    gate.set()
    with pytest.raises(OSError, match="No space left"):
        worker.save(str(tmp_path / "b"), 2)
    assert not (tmp_path / "a" / "meta.json").exists()  # never marked whole
    monkeypatch.undo()
    worker.save(str(tmp_path / "b"), 2)  # reported once; the next save writes
    assert checkpoints.trainer_part_missing(tmp_path / "b") == []
