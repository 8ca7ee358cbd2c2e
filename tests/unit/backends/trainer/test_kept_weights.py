"""--keep-old-actor's host copies (`relax.backends.trainer.kept_weights`) and --disable-weights-backuper's
freed offload buffers (`relax.backends.trainer.offload.HostStash`): a kept version is swapped in for a
forward and the live weights come back after it; old log-probs scored on the kept weights are those
of the pushed weights, not of the weights trained since."""

from __future__ import annotations

import pytest
import torch

from relax.backends.base import TrainerSpec
from relax.backends.trainer.kept_weights import KeptWeights, kept_weights_of
from relax.backends.trainer.offload import HostStash
from relax.backends.trainer.trainer import Trainer
from relax.config.schema import BatchConfig
from relax.utils.net import free_port

CPU = torch.device("cpu")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: one storage behind two names
    return model


def _state(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _train(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def _same(model: torch.nn.Module, state: list[torch.Tensor]) -> bool:
    return all(torch.equal(p, s) for p, s in zip(model.parameters(), state))


def test_a_kept_version_is_swapped_in_and_the_live_weights_come_back():
    model = _model()
    kept = KeptWeights(1, CPU, model.parameters)
    pushed = _state(model)
    kept.pushed(3)
    _train(model)
    trained = _state(model)
    with kept.weights_of(3):
        assert _same(model, pushed) and model[1].weight is model[0].weight
    assert _same(model, trained)
    assert kept.nbytes == 2 * 10 * 4 * 4  # the copy and the scratch buffer, the tied weight once each


def test_the_oldest_version_goes_first_and_a_missing_one_is_an_error():
    model = _model()
    kept = KeptWeights(2, CPU, model.parameters)
    for version in (1, 2, 3):
        kept.pushed(version)
        _train(model)
    assert list(kept.copies) == [2, 3]
    with pytest.raises(RuntimeError, match=r"no copy of weight version 1 .*keeps \[2, 3\]"):
        with kept.weights_of(1):
            pass
    with pytest.raises(RuntimeError, match="keeps none"):
        kept_weights_of(None, 1)


def test_a_receiver_keeps_each_version_as_it_lands_and_scores_its_live_one_in_place():
    model = _model()
    kept = KeptWeights(2, CPU, model.parameters)
    kept.received(5)
    v5 = _state(model)
    kept.receiving()  # a push starts landing: the live weights are mixed
    _train(model)
    kept.received(6)
    assert kept.live == 6 and list(kept.copies) == [5, 6]
    with kept.weights_of(6):  # the live version: no copy made
        assert kept._scratch == []
    kept.receiving()
    _train(model)  # half of version 7 landed
    landing = _state(model)
    with kept.weights_of(5):
        assert _same(model, v5)
    assert _same(model, landing)  # what was landing is back, to be completed by the push


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    path = str(tmp_path_factory.mktemp("kept") / "model")
    Qwen3ForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def test_old_log_probs_use_the_kept_weights_not_the_current_ones(tiny):
    tokens, lengths = [[1, 5, 9, 3, 7], [2, 4, 6]], [3, 2]
    spec = TrainerSpec(model_path=tiny, trainable=False, threads=1, batch=BatchConfig(micro_batch_size=2),
                       keep_weights=1)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        pushed = worker.compute_log_probs(tokens, lengths)
        worker.push_weights(4)  # no receivers connected: the push only keeps what it would send
        _train(worker.runner.model)  # the optimizer steps since the push
        current = worker.compute_log_probs(tokens, lengths)
        old = worker.compute_log_probs(tokens, lengths, weights_version=4)
        after = worker.compute_log_probs(tokens, lengths)
        with pytest.raises(RuntimeError, match="no copy of weight version 3"):
            worker.compute_log_probs(tokens, lengths, weights_version=3)
    finally:
        worker.shutdown()
    assert old == pushed and current != pushed and after == current


def test_without_the_backuper_the_offload_buffers_are_freed_after_each_onload():
    model = _model()
    kept_buffers, freed = HostStash(), HostStash(keep_buffers=False)
    for stash in (kept_buffers, freed):
        before = _state(model)
        stash.offload(list(model.parameters()), CPU)
        assert stash.hosts  # the state is on the host while offloaded
        stash.onload()
        assert _same(model, before)
    assert kept_buffers.hosts and not freed.hosts  # --disable-weights-backuper: no host copy while training


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kept_weights_on_a_gpu_use_pinned_buffers_and_swap_back():
    device = torch.device("cuda", 0)
    model = _model().to(device)
    kept = KeptWeights(1, device, model.parameters)
    pushed = _state(model)
    kept.pushed(1)
    _train(model)
    trained = _state(model)
    assert all(b.is_pinned() for b in kept.copies[1])
    with kept.weights_of(1):
        assert _same(model, pushed)
    assert _same(model, trained)
