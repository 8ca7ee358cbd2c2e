"""Helpers of the on-policy distillation tests: a briefly SFT-ed student, a wider and longer
SFT-ed teacher with the same tokenizer, and a zero reward (so the teacher is the only signal)."""

from __future__ import annotations

import random


def zero_reward(args, sample, **kwargs):
    return 0.0


def build_sft_model(tokenizer_dir: str, out_dir: str, *, hidden_size: int, steps: int, seed: int) -> str:
    """A tiny Qwen3 with the tokenizer of `tokenizer_dir`, SFT-ed on the task for `steps` steps."""
    import torch
    from transformers import AutoTokenizer

    from examples.tiny_math.sft import sft_train
    from examples.tiny_math.task import sample_numbers
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = build_tiny_qwen3(tokenizer, hidden_size=hidden_size, num_layers=2, seed=seed)
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sft_train(model, tokenizer, [sample_numbers(rng) for _ in range(512)], steps=steps, batch_size=32,
                  lr=3e-3, seed=seed)
    finally:
        torch.set_num_threads(threads)
    return save_tiny_model(model.eval(), tokenizer, out_dir)
