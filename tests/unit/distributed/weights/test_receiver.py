"""Receiving side: HF names, fused MoE experts included, load into a transformers model."""

from __future__ import annotations

import torch

from relax.distributed.weights.receiver import WeightReceiver


def test_per_expert_names_load_into_fused_moe_weights(tmp_path):
    """Checkpoint names of MoE experts (what SGLang loads and the megatron backend pushes) land in
    transformers' fused expert weights; a wrong shape still rejects the bucket."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=4,
                         num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8)
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(cfg).save_pretrained(tmp_path / "a")
    torch.manual_seed(1)
    Qwen3MoeForCausalLM(cfg).save_pretrained(tmp_path / "b")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    new = load_file(str(tmp_path / "b" / "model.safetensors"))  # per-expert names
    receiver = WeightReceiver(model)
    ok, message = receiver.load_named(sorted(new.items()))
    assert ok, message
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "b").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded[name]), name
    bad = [("model.layers.0.mlp.experts.1.up_proj.weight", torch.zeros(3, 3))]
    ok, message = receiver.load_named(bad)
    assert not ok and "model.layers.0.mlp.experts.1.up_proj.weight" in message
