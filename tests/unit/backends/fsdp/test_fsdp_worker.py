"""One fsdp rank in-process (world size 1, gloo): log-prob passes, a training step, metrics."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed.ray.actor_group import free_port


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("m")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    from relax.backends.fsdp.worker import FSDPTrainWorker

    spec = TrainerSpec(model_path=str(path), optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=2),
                       loss=PolicyLossConfig(), threads=1)
    w = FSDPTrainWorker(0, 1, "127.0.0.1", free_port(), spec)
    yield w
    w.shutdown()


def batch():
    tokens = [[1, 2, 3, 4, 5], [1, 2, 6, 7], [3, 4, 5, 6, 7, 8]]
    lengths = [2, 2, 3]
    return {"tokens": tokens, "response_lengths": lengths, "loss_masks": [[1] * n for n in lengths],
            "advantages": [[1.0] * 2, [-1.0] * 2, [0.5] * 3]}


def test_log_probs_match_a_plain_forward(worker):
    b = batch()
    got = worker.compute_log_probs(b)
    model = worker.model
    for toks, n, lp in zip(b["tokens"], b["response_lengths"], got):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([toks])).logits[0, :-1]
        ref = torch.log_softmax(logits.float(), -1)[torch.arange(len(toks) - n - 1, len(toks) - 1),
                                                     torch.tensor(toks[-n:])]
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-5)


def test_first_step_has_unit_ratio_and_reports_rollout_mismatch(worker):
    b = batch()
    b["old_log_probs"] = worker.compute_log_probs(b)
    b["rollout_log_probs"] = [[x - 0.25 for x in lp] for lp in b["old_log_probs"]]
    metrics = worker.train(b, 1, [7])
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["pg_clipfrac"] == 0.0
    assert metrics["train_rollout_logprob_abs_diff_mean"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["grad_norm"] > 0
    assert metrics["compute_seconds"] > 0
