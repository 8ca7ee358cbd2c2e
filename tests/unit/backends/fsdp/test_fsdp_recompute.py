"""--recompute-granularity full on the fsdp backend: per-layer activation checkpointing that changes
memory, not the step. Its own module: the workers here need the process's default group, which
test_fsdp_runner.py's module-scoped worker holds while it lives."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed.ray.actor_group import free_port

from test_fsdp_runner import batch, log_probs


def _save_tiny_model(path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)


def _worker(path, **spec):
    from relax.backends.trainer.trainer import Trainer

    return Trainer(0, 1, "127.0.0.1", free_port(), TrainerSpec(
        model_path=str(path), optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=2),
        loss=PolicyLossConfig(), threads=1, **spec))



@pytest.mark.parametrize("recompute_layers", [-1, 1])
def test_recomputed_layers_give_the_same_step(tmp_path, recompute_layers):
    """--recompute-granularity full (every layer, or the first k with block) changes memory, not the step."""
    _save_tiny_model(tmp_path)
    results = []
    for layers in (None, recompute_layers):
        w = _worker(tmp_path, recompute_layers=layers)
        try:
            checkpointed = [layer.gradient_checkpointing for layer in w.runner.model.model.layers]
            b = batch()
            b.old_log_probs_RT = log_probs(w, b)
            metrics = w.train(b, 1, [7])
            results.append((checkpointed, metrics["grad_norm"], log_probs(w, b)))
        finally:
            w.shutdown()
    assert results[0][0] == [False, False]
    assert results[1][0] == ([True, True] if recompute_layers == -1 else [True, False])
    assert results[1][1] == pytest.approx(results[0][1], rel=1e-5)
    assert torch.allclose(torch.tensor(sum(results[1][2], [])), torch.tensor(sum(results[0][2], [])), atol=1e-6)


def test_one_on_policy_pass_takes_the_training_forwards_log_probs_as_the_old_ones(tmp_path):
    """old_logp_from_training: no old log-probs in the batch, the same step as with them recomputed."""
    _save_tiny_model(tmp_path)
    results = []
    for reuse in (False, True):
        w = _worker(tmp_path, old_logp_from_training=reuse)
        try:
            b = batch()
            b.rollout_log_probs_RT = [[-1.0] * n for n in b.response_lengths_R]
            if not reuse:
                b.old_log_probs_RT = log_probs(w, b)
            metrics = w.train(b, 1, [7])
            results.append((metrics, log_probs(w, b)))
        finally:
            w.shutdown()
    (plain, after_plain), (reused, after_reused) = results
    assert reused["ppo_kl"] == 0.0 and reused["pg_clipfrac"] == 0.0
    assert reused["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
    assert torch.allclose(torch.tensor(sum(after_reused, [])), torch.tensor(sum(after_plain, [])), atol=1e-5)


def test_weights_travel_in_the_push_dtype(tmp_path):
    """TrainerSpec.push_dtype: floating parameters are cast before they are sent (bf16 training
    pushes half the bytes); without it the parameters' own memory goes out, marked not fresh, so
    a background push knows to snapshot it."""
    _save_tiny_model(tmp_path)
    w = _worker(tmp_path)
    try:
        params = dict(w.runner.model.named_parameters())
        as_is = list(w.runner.hf_state())
        assert [n for n, _, _ in as_is] == list(params)
        assert all(t.dtype == torch.float32 and not fresh for _, t, fresh in as_is)
        cast = list(w.runner.hf_state(torch.bfloat16))
        assert all(t.dtype == torch.bfloat16 and fresh for _, t, fresh in cast)
        for name, t, _ in cast:
            assert torch.equal(t, params[name].detach().to(torch.bfloat16))
    finally:
        w.shutdown()


def test_bf16_training_pushes_bf16_except_true_on_policy():
    from relax.components.training import push_dtype
    from relax.config import parse_config

    base = ["--hf-checkpoint", "m", "--prompt-data", "d.jsonl"]
    assert push_dtype(parse_config(base, validate=False)) is None
    assert push_dtype(parse_config(base + ["--bf16"], validate=False)) == "bfloat16"
    assert push_dtype(parse_config(base + ["--bf16", "--true-on-policy-mode"], validate=False)) is None
