"""Chunked log-probs and entropy equal the plain [N, V] computation, values and gradients."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.chunked_logprobs import auto_chunk, chunked_token_log_probs
from relax.algorithms.losses import entropy_from_logits


def _plain(hidden, weight, targets, temperature):
    z = (hidden @ weight.T).float() / temperature
    logp = torch.log_softmax(z, -1).gather(1, targets[:, None]).squeeze(1)
    return logp, entropy_from_logits(z)


def _inputs(dtype=torch.float64, n=13, h=8, v=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g) * 2).to(dtype).requires_grad_()
    weight = torch.randn(v, h, generator=g).to(dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 4, 13, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_plain_computation(chunk, temperature):
    hidden, weight, targets = _inputs()
    logp, ent = chunked_token_log_probs(hidden, weight, targets, temperature=temperature, chunk=chunk, entropy=True)
    ref_logp, ref_ent = _plain(hidden, weight, targets, temperature)
    torch.testing.assert_close(logp, ref_logp.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent.float(), rtol=1e-5, atol=1e-5)

    w_logp, w_ent = torch.randn(len(targets), dtype=torch.float32), torch.randn(len(targets), dtype=torch.float32)
    grads = torch.autograd.grad((logp * w_logp).sum() + (ent * w_ent).sum(), (hidden, weight))
    ref = torch.autograd.grad((ref_logp.float() * w_logp).sum() + (ref_ent.float() * w_ent).sum(), (hidden, weight))
    for got, want in zip(grads, ref):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_entropy_unused_or_not_asked_for_costs_no_gradient_and_logp_alone_is_right():
    hidden, weight, targets = _inputs()
    logp, ent = chunked_token_log_probs(hidden, weight, targets, chunk=5)
    assert ent is None
    ref_logp, _ = _plain(hidden, weight, targets, 1.0)
    want = torch.autograd.grad(ref_logp.sum(), hidden)[0]
    torch.testing.assert_close(torch.autograd.grad(logp.sum(), hidden)[0], want, rtol=1e-5, atol=1e-6)
    logp, ent = chunked_token_log_probs(hidden, weight, targets, chunk=5, entropy=True)  # entropy as a metric only
    torch.testing.assert_close(torch.autograd.grad(logp.sum(), hidden)[0], want, rtol=1e-5, atol=1e-6)


def test_bf16_inputs_match_the_plain_bf16_matmul_then_float32():
    hidden, weight, targets = _inputs(torch.bfloat16, n=9, h=16, v=50)
    logp, ent = chunked_token_log_probs(hidden, weight, targets, chunk=4, entropy=True)
    ref_logp, ref_ent = _plain(hidden, weight, targets, 1.0)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    g = torch.autograd.grad(logp.sum(), weight)[0]
    assert g.dtype == torch.bfloat16 and torch.isfinite(g.float()).all()


def test_auto_chunk_and_bad_temperature():
    assert auto_chunk(151936) == (1 << 30) // (4 * 151936)
    assert auto_chunk(10) > 1_000_000 and auto_chunk(0) >= 1
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="temperature must be > 0"):
        chunked_token_log_probs(hidden, weight, targets, temperature=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_path_equals_the_plain_computation(monkeypatch, temperature):
    """`fused=True` runs `_chunk_stats` / `_chunk_grad` per chunk (compiled on GPUs; here the same
    functions uncompiled): the same values, the entropy metric, and the same gradients; an entropy
    gradient falls back to the eager backward."""
    from relax.algorithms import chunked_logprobs as mod

    monkeypatch.setattr(mod, "_fused", lambda name: {"stats": mod._chunk_stats, "grad": mod._chunk_grad}[name])
    hidden, weight, targets = _inputs()
    ref_logp, ref_ent = _plain(hidden, weight, targets, temperature)
    logp, ent = chunked_token_log_probs(hidden, weight, targets, temperature=temperature, chunk=4, entropy=True,
                                        fused=True)
    torch.testing.assert_close(logp, ref_logp.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent.float(), rtol=1e-5, atol=1e-5)
    w = torch.randn(len(targets), dtype=torch.float32)
    for loss, ref_loss in (((logp * w).sum(), (ref_logp.float() * w).sum()),
                           ((logp * w).sum() + ent.sum(), (ref_logp.float() * w).sum() + ref_ent.float().sum())):
        got = torch.autograd.grad(loss, (hidden, weight), retain_graph=True)
        want = torch.autograd.grad(ref_loss, (hidden, weight), retain_graph=True)
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_path_compiled_on_a_gpu_matches_the_eager_path():
    hidden, weight, targets = (t.cuda() if t.dtype == torch.long else t.detach().cuda().bfloat16().requires_grad_()
                               for t in _inputs(n=300, h=64, v=1000))
    got = chunked_token_log_probs(hidden, weight, targets, chunk=128, fused=True)[0]
    want = chunked_token_log_probs(hidden, weight, targets, chunk=128)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=2e-3)
    g_got = torch.autograd.grad(got.sum(), (hidden, weight))
    g_want = torch.autograd.grad(want.sum(), (hidden, weight))
    for g, r in zip(g_got, g_want):
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-2, atol=2e-2)
