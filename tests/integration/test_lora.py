"""A LoRA run through the real service graph (--lora-rank, colocate, hf engines, KL loss): the actor
trains adapters only, every weight push carries the adapter tensors only (its bytes, a fraction of the
model's), the engines apply each pushed adapter (their log-probs are the trainer's), the Reference is
the base model with the adapter off (KL 0 before the first update, positive after), and --save-hf
writes the merged model and the peft adapter. Resume equality and the rest are unit tests
(tests/unit/backends/fsdp/test_fsdp_lora.py), to keep CI to one short run."""

from __future__ import annotations

import pytest
from run_helpers import check_trained, reference_args, run_relax, step_rows

pytestmark = pytest.mark.integration

RANK, ALPHA = 8, 16


@pytest.fixture(scope="module")
def lora_run(ray_cluster, tiny_setup, tmp_path_factory):
    exp = tmp_path_factory.mktemp("lora_run")
    run_relax(reference_args(tiny_setup, exp / "run", num_rollout=2, reference=False) + [
        "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--lr", "2e-2",
        "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl", "--save-hf", str(exp / "hf")])
    return exp


def adapter_and_model_bytes(model_dir) -> tuple[int, int]:
    from transformers import AutoModelForCausalLM

    from relax.backends.lora import adapter_parameters, add_adapters
    from relax.config.lora import LoraSpec

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    add_adapters(model, LoraSpec(RANK, ALPHA))
    return sum(p.numel() * p.element_size() for _, p in adapter_parameters(model)), full


def test_lora_run_pushes_adapters_only_and_trains_them(lora_run, tiny_setup):
    steps = step_rows(lora_run / "run")
    assert len(steps) == 2
    check_trained(steps)  # finite losses, gradients, and a PPO ratio of exactly 1 on the first pass
    adapter, full = adapter_and_model_bytes(tiny_setup / "model")
    assert [r["weight_sync/bytes"] for r in steps] == [adapter] * 2 and adapter < full / 5
    kl = [r["train/kl_loss"] for r in steps]
    assert kl[0] == pytest.approx(0.0, abs=1e-7) and kl[1] > 1e-5, kl  # the reference: adapter off
    # The engines generated step 1 with the adapter pushed after step 0: their log-probs are the trainer's.
    diffs = [r["train/train_rollout_logprob_abs_diff_mean"] for r in steps]
    assert max(diffs) < 1e-4, diffs
    assert (lora_run / "hf" / "adapter" / "adapter_model.safetensors").is_file()
    assert (lora_run / "hf" / "model.safetensors").is_file()
