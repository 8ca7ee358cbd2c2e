"""HF -> Megatron -> HF is bit-exact for every supported family, through every shard layout."""

from __future__ import annotations

import pytest
import torch

from relax.backends.megatron.convert import (
    ConversionError, Layout, expert_range, global_name, hf_to_megatron, hf_tensors, shard_state, stage_layers,
    tp_merge,
)


def tiny(model_type: str):
    import transformers as tf

    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2)
    cfg = {"llama": lambda: tf.LlamaConfig(**common),
           "mistral": lambda: tf.MistralConfig(**common, head_dim=8),
           "qwen2": lambda: tf.Qwen2Config(**common, tie_word_embeddings=False),
           "qwen3": lambda: tf.Qwen3Config(**common, head_dim=8, tie_word_embeddings=True),
           "qwen3_moe": lambda: tf.Qwen3MoeConfig(**common, head_dim=8, moe_intermediate_size=16, num_experts=4,
                                                  num_experts_per_tok=2, norm_topk_prob=True)}[model_type]()
    return cfg


def checkpoint_state(cfg, tmp_path) -> dict[str, torch.Tensor]:
    """What save_pretrained writes (the checkpoint's names: per-expert MoE weights)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    return load_file(str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("tp,pp,ep", [(1, 1, 1), (2, 1, 1), (2, 2, 1), (1, 2, 2), (2, 1, 2)])
def test_round_trip_is_bit_exact(model_type, tp, pp, ep, tmp_path):
    cfg = tiny(model_type)
    cfg.vocab_size = 67  # odd: padded to 128 x tp rows on the Megatron side, cut back on the way out
    layout = Layout.from_hf_config(cfg).padded(128 * tp)
    if ep > 1 and not layout.num_experts:
        pytest.skip("expert parallelism needs experts")
    hf = checkpoint_state(cfg, tmp_path)
    full = hf_to_megatron(hf, layout)
    stages = stage_layers(layout.num_layers, pp)
    # Every (stage, expert rank, tensor rank) holds its shards under local names ...
    shards: dict[str, list[torch.Tensor]] = {}
    for s, layers in enumerate(stages):
        for e in range(ep):
            experts = expert_range(layout.num_experts, ep, e) if layout.num_experts else None
            for t in range(tp):
                local = shard_state(full, tp=tp, tp_rank=t, layers=layers, experts=experts, first_stage=s == 0,
                                    last_stage=s == pp - 1, tied=layout.tied)
                for name, tensor in local.items():
                    if name == "output_layer.weight" and layout.tied:
                        continue  # the last stage's copy of the tied embedding
                    g = global_name(name, layers, experts)
                    if ".experts." in g:
                        shards.setdefault(g, [tensor]) if t == 0 else None
                    elif e == 0:
                        shards.setdefault(g, []).append(tensor)
    # ... which merge back into the full tensors and the same HF tensors, bit for bit.
    merged = {name: tp_merge(name, parts) for name, parts in shards.items()}
    assert set(merged) == set(full)
    back = dict(hf_tensors(merged.items(), layout))
    assert set(back) == set(hf) - ({"lm_head.weight"} if layout.tied else set())
    for name, tensor in back.items():
        assert torch.equal(tensor, hf[name]), name


def test_errors_name_the_problem(tmp_path):
    cfg = tiny("qwen3")
    layout = Layout.from_hf_config(cfg)
    hf = checkpoint_state(cfg, tmp_path)
    with pytest.raises(ConversionError, match="no 'model.layers.0.self_attn.q_norm.weight'"):
        hf_to_megatron({k: v for k, v in hf.items() if k != "model.layers.0.self_attn.q_norm.weight"}, layout)
    with pytest.raises(ConversionError, match="have no Megatron place"):
        hf_to_megatron({**hf, "model.visual.proj.weight": torch.zeros(1)}, layout)
    with pytest.raises(ConversionError, match="do not split evenly into 3 pipeline stages"):
        stage_layers(4, 3)
    assert stage_layers(5, 3, first=1) == [range(0, 1), range(1, 3), range(3, 5)]
    gpt2 = type("C", (), {"model_type": "gpt2"})()
    with pytest.raises(ConversionError, match="model_type 'gpt2' has no Megatron conversion"):
        Layout.from_hf_config(gpt2)


def test_the_vocabulary_pads_to_a_multiple_with_zero_rows():
    layout = Layout.from_hf_config(tiny("qwen2"))  # untied: embedding and output layer
    assert layout.vocab_rows == 64 and layout.padded(128).vocab_rows == 128 and layout.padded(32).vocab_rows == 64
    padded = layout.padded(3 * 128)
    hf = {"model.embed_tokens.weight": torch.randn(64, 32), "lm_head.weight": torch.randn(64, 32)}
    from relax.backends.megatron.convert import fuse, megatron_sources, megatron_to_hf

    sources = megatron_sources(padded)
    for name, hf_name in (("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
                          ("output_layer.weight", "lm_head.weight")):
        full = fuse(sources[name], [hf[hf_name]], padded)
        assert full.shape == (384, 32) and torch.equal(full[:64], hf[hf_name]) and not full[64:].any()
        assert [(n, t.shape) for n, t in megatron_to_hf(name, full, padded)] == [(hf_name, (64, 32))]



@pytest.mark.parametrize("etp,tp", [(2, 1), (2, 2), (4, 1)])
def test_experts_split_over_expert_tensor_ranks_and_merge_back(etp, tp, tmp_path):
    """--expert-tensor-parallel-size: each expert's [gate; up] rows and down columns split over the
    expert tensor ranks as dense MLPs split over tensor ranks; the dense weights keep their TP split."""
    cfg = tiny("qwen3_moe")
    layout = Layout.from_hf_config(cfg).padded(128 * tp)
    full = hf_to_megatron(checkpoint_state(cfg, tmp_path), layout)
    experts = expert_range(layout.num_experts, 1, 0)
    local = [shard_state(full, tp=tp, tp_rank=x % tp, layers=range(4), experts=experts, first_stage=True,
                         last_stage=True, tied=layout.tied, etp=etp, etp_rank=x) for x in range(etp)]
    fc1 = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
    fc2 = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"
    assert local[0][fc1].shape == (2 * 16 // etp, 32) and local[0][fc2].shape == (32, 16 // etp)
    for name in (fc1, fc2):
        assert torch.equal(tp_merge(name, [part[name] for part in local]), full[name])
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert torch.equal(local[0][qkv], shard_state(full, tp=tp, tp_rank=0, layers=range(4), experts=experts,
                                                  first_stage=True, last_stage=True, tied=layout.tied)[qkv])


def test_model_name_picks_the_conversion_family():
    """--model-name: a model_type, slime's spelling or a VL model's type names a converter family; a
    checkpoint whose model_type has none converts under the family its layers follow; an unknown name
    is an error listing the known ones (the config check's list is the converter's)."""
    from relax.backends.megatron.convert import FAMILIES
    from relax.config.checks.megatron import MEGATRON_FAMILIES, conversion_family

    assert tuple(FAMILIES) == MEGATRON_FAMILIES
    assert [conversion_family(n) for n in ("qwen3moe", "Qwen3-MoE", "qwen2_5_vl", "llama", "gpt2")] == \
        ["qwen3_moe", "qwen3_moe", "qwen2_5_vl_text", "llama", None]
    cfg = tiny("qwen3")
    cfg.model_type = "my_finetuned_qwen3"
    with pytest.raises(ConversionError, match="model_type 'my_finetuned_qwen3' has no Megatron conversion"):
        Layout.from_hf_config(cfg)
    layout = Layout.from_hf_config(cfg, "qwen3")
    assert layout.model_type == "qwen3" and layout.qk_norm
    assert not Layout.from_hf_config(cfg, "llama").qk_norm  # the family decides what the layers have
    with pytest.raises(ConversionError, match="--model-name gpt2 has no Megatron conversion; known: llama, mistral"):
        Layout.from_hf_config(cfg, "gpt2")
