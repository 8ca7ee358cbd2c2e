"""`--use-rollout-entropy`: a scoring forward also returns each response token's entropy
(`Trainer.compute_log_probs(..., entropy=True)`), the entropy of the same distribution its
log-prob comes from; the log-probs are the same as without it."""

from __future__ import annotations

import pytest
import torch

from relax.backends.base import TrainerSpec
from relax.backends.trainer.trainer import Trainer
from relax.config.schema import BatchConfig
from relax.utils.net import free_port


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    model = Qwen3ForCausalLM(config).eval()
    path = str(tmp_path_factory.mktemp("entropy") / "model")
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def test_entropies_come_with_the_log_probs_of_the_same_forward(tiny):
    path, model = tiny
    tokens, lengths = [[1, 5, 9, 3, 7], [2, 4, 6]], [3, 2]
    worker = Trainer(0, 1, "127.0.0.1", free_port(), TrainerSpec(model_path=path, trainable=False, threads=1,
                                                                 batch=BatchConfig(micro_batch_size=2)))
    try:
        plain = worker.compute_log_probs(tokens, lengths)
        logps, entropies = worker.compute_log_probs(tokens, lengths, entropy=True)
    finally:
        worker.shutdown()
    assert logps == plain
    for row, n, got_logp, got_ent in zip(tokens, lengths, logps, entropies):
        with torch.no_grad():
            logits = model(torch.tensor([row])).logits[0, -n - 1:-1].float()  # the logits predicting the response
        dist = torch.log_softmax(logits, dim=-1)
        expected = -(dist.exp() * dist).sum(-1)
        assert len(got_ent) == n and torch.allclose(torch.tensor(got_ent), expected, atol=1e-4)
        assert torch.allclose(torch.tensor(got_logp), dist.gather(-1, torch.tensor(row[-n:])[:, None])[:, 0],
                              atol=1e-4)
