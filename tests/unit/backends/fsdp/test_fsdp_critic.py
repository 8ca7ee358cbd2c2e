"""The fsdp backend's critic role in-process (world size 1, gloo): a value head on the causal-LM
body, response-aligned values, a value-loss step that fits returns, and a DCP round trip."""

from __future__ import annotations

import pytest
import torch

from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.types import TrainBatch
from relax.utils.net import free_port


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("critic_model")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return str(path)


def make_critic(path: str, lr: float = 1e-2):
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(model_path=path, head="value", optim=OptimizerConfig(lr=lr),
                       batch=BatchConfig(micro_batch_size=2), threads=1, value_clip=100.0)
    return Trainer(0, 1, "127.0.0.1", free_port(), spec)


def batch() -> TrainBatch:
    tokens = [[1, 2, 3, 4, 5], [1, 2, 6, 7], [3, 4, 5, 6, 7, 8]]
    lengths = [2, 2, 3]
    return TrainBatch(tokens_RL=tokens, response_lengths_R=lengths, loss_masks_RT=[[1] * n for n in lengths])


def values(critic, b: TrainBatch) -> list[list[float]]:
    return critic.compute_values(b.tokens_RL, b.response_lengths_R)


def test_critic_values_are_the_head_at_the_positions_that_choose_each_token(model_path):
    critic = make_critic(model_path)
    try:
        b = batch()
        got = values(critic, b)
        assert [len(v) for v in got] == b.response_lengths_R
        for toks, n, row in zip(b.tokens_RL, b.response_lengths_R, got):
            with torch.no_grad():
                head = critic.runner.model(input_ids=torch.tensor([toks], device=critic.device)).logits[0, :, 0].cpu()
            assert torch.allclose(torch.tensor(row), head[len(toks) - n - 1: len(toks) - 1], atol=1e-5)
        assert critic.runner.model.config.num_labels == 1
    finally:
        critic.shutdown()


def test_value_steps_move_values_towards_returns_and_checkpoint_round_trips(model_path, tmp_path):
    critic = make_critic(model_path)
    b = batch()
    b.returns_RT = [[1.0] * n for n in b.response_lengths_R]
    losses = []
    for _ in range(5):
        b.values_RT = values(critic, b)
        metrics = critic.train(b, 1, [7])
        losses.append(metrics["value_loss"])
    assert losses[-1] < 0.5 * losses[0]
    assert {"value_clipfrac", "values_mean", "returns_mean", "grad_norm", "lr"} <= set(metrics)
    trained = values(critic, b)
    critic.save(str(tmp_path), rollout_id=3)
    critic.shutdown()

    fresh = make_critic(model_path)
    try:
        assert not torch.allclose(torch.tensor(values(fresh, b)[2]), torch.tensor(trained[2]))
        meta = fresh.load(str(tmp_path))
        assert meta["rollout_id"] == 3 and meta["has_optim"]
        for a, c in zip(values(fresh, b), trained):
            assert torch.allclose(torch.tensor(a), torch.tensor(c), atol=1e-6)
    finally:
        fresh.shutdown()
