"""Shared fixtures for the hf engine tests: a tiny random Qwen3 + word-level tokenizer on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from relax.backends.hf.tiny_model import build_tiny_qwen3


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Tiny Qwen3 (hidden 32, 2 layers, vocab 64, float32), seed 0."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), seed=0)


@pytest.fixture(scope="session")
def other_tiny_model_dir(tmp_path_factory) -> Path:
    """Same architecture as tiny_model_dir, different random weights (seed 1)."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3-other"), seed=1)


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def reference_greedy():
    """Returns `_reference_greedy(model, prompt, max_new_tokens) -> (tokens, logprobs)`."""
    return _reference_greedy


def _reference_greedy(model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """Plain step-by-step greedy decoding with full forwards (no cache, no padding), one prompt alone."""
    import torch

    ids, out, logprobs = list(prompt), [], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
            out.append(token)
    return out, logprobs
