"""On a GPU in bf16, the hf engine's sampled-token log-probs (slot cache, CUDA graphs, compiled
sampler) and the fsdp trainer's (bf16 compute over float32 master weights, chunked head,
compiled with --use-torch-compile or not) agree within bf16 tolerance. Skipped without CUDA."""

from __future__ import annotations

import statistics

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed.ray.actor_group import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_engine_and_trainer_log_probs_agree_in_bf16(tmp_path, compiled):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from relax.backends.trainer.trainer import Trainer
    from relax.backends.hf.decoder import BatchDecoder
    from relax.backends.hf.rows import DecodeRow
    from relax.backends.hf.sampling import parse_sampling_params
    from relax.backends.hf.tiny_model import build_tiny_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=32, pad_token_id=0, eos_token_id=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    engine_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).cuda().eval()
    decoder = BatchDecoder(engine_model, build_tiny_tokenizer(), device="cuda", eos_token_ids=[2],
                           max_context_len=512, seed=0)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(4, 40, (32,), generator=g)
    prompts = [torch.randint(3, 2048, (int(n),), generator=g).tolist() for n in lengths]
    rows = [DecodeRow(p, parse_sampling_params({"temperature": 1.0, "max_new_tokens": 48, "ignore_eos": True,
                                                "sampling_seed": i})) for i, p in enumerate(prompts)]
    results = decoder.run(rows)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), TrainerSpec(
        model_path=str(tmp_path), optim=OptimizerConfig(lr=1e-6, bf16=True), batch=BatchConfig(micro_batch_size=32),
        loss=PolicyLossConfig(), compile_layers=compiled))
    try:
        trainer = worker.compute_log_probs([p + r.output_ids for p, r in zip(prompts, results)],
                                           [len(r.output_ids) for r in results])
    finally:
        worker.shutdown()
    diffs = [abs(a - b) for r, t in zip(results, trainer) for a, b in zip(r.output_logprobs, t)]
    assert len(diffs) == 32 * 48
    print(f"engine vs trainer log-probs ({'compiled' if compiled else 'eager'}): mean |diff| "
          f"{statistics.mean(diffs):.4f}, max {max(diffs):.4f}")
    assert statistics.mean(diffs) < 0.02 and max(diffs) < 0.25
