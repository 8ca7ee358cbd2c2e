"""LoRA adapters on an HF model (`relax.backends.lora`): targets as peft matches them, a fresh adapter
is the base model, `adapters_off` gives the base model back, the merged weights compute what the
adapted model does, and loading a new adapter replaces the old one's delta."""

from __future__ import annotations

import pytest
import torch

from relax.backends.lora import adapter_parameters, adapters_off, add_adapters, merged_state
from relax.config.lora import LoraSpec


def tiny():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8)).eval()


IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])


def test_targets_match_as_peft_and_all_linear_skips_the_output_layer():
    names = add_adapters(tiny(), LoraSpec(4, 8.0, ("q_proj", "mlp.down_proj")))
    assert names == [f"model.layers.{i}.{m}" for i in (0, 1) for m in ("mlp.down_proj", "self_attn.q_proj")]
    every = add_adapters(tiny(), LoraSpec(4, 8.0))
    assert len(every) == 2 * 7 and "lm_head" not in every  # q, k, v, o, gate, up, down per layer


def test_unknown_targets_fail_naming_the_flag_and_the_layers():
    with pytest.raises(ValueError, match="--lora-target-modules qkv matches no linear layer.*q_proj"):
        add_adapters(tiny(), LoraSpec(4, 8.0, ("qkv",)))


def test_a_fresh_adapter_is_the_base_model_and_only_it_trains():
    model = tiny()
    base = model(IDS).logits
    add_adapters(model, LoraSpec(4, 8.0))
    assert torch.equal(model(IDS).logits, base)  # B starts at zero
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == [n for n, _ in adapter_parameters(model)] and len(trainable) == 28


def test_adapters_off_merge_and_replace():
    model = tiny()
    base = model(IDS).logits
    spec = LoraSpec(4, 8.0, ("q_proj", "v_proj", "up_proj"))
    add_adapters(model, spec)
    torch.manual_seed(1)
    first = {n: torch.randn_like(p) * 0.1 for n, p in adapter_parameters(model)}
    second = {n: torch.randn_like(p) * 0.1 for n, p in adapter_parameters(model)}
    with torch.no_grad():
        for n, p in adapter_parameters(model):
            p.copy_(first[n])
    adapted = model(IDS).logits
    assert not torch.allclose(adapted, base, atol=1e-4)
    with adapters_off(model):
        assert torch.equal(model(IDS).logits, base)
    merged = tiny()
    merged.load_state_dict(merged_state(dict(model.state_dict()), spec))
    assert torch.allclose(merged(IDS).logits, adapted, atol=1e-5)
    with torch.no_grad():  # a second adapter replaces the first: W0 never changed
        for n, p in adapter_parameters(model):
            p.copy_(second[n])
    only_second = tiny()
    only_second.load_state_dict(merged_state({**tiny().state_dict(), **second}, spec))  # pristine W0 + second
    assert torch.allclose(model(IDS).logits, only_second(IDS).logits, atol=1e-5)
