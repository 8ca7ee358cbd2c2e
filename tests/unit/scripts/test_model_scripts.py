"""scripts/models/*.sh agree with the HF config of the model they name.

Each script's MODEL_ARGS (read by bash itself) are parsed with the real flag parser against a
config.json generated from transformers' config class with the published model's values, under
both backends; the megatron backend's own check (`check_arch_flags`) reads the same config as
the worker does. A flag that disagrees must fail."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess

import pytest

from relax.config import ConfigError, parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
QWEN3 = dict(vocab_size=151936, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6)
# script -> (transformers config class, the published config's values)
CONFIGS = {
    "qwen3-0.6B.sh": ("Qwen3Config", dict(QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                          num_attention_heads=16, tie_word_embeddings=True)),
    "qwen3-4B.sh": ("Qwen3Config", dict(QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                        num_attention_heads=32, tie_word_embeddings=True)),
    "qwen3-8B.sh": ("Qwen3Config", dict(QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                        num_attention_heads=32, tie_word_embeddings=False)),
    "qwen3-30B-A3B.sh": ("Qwen3MoeConfig", dict(QWEN3, hidden_size=2048, intermediate_size=6144,
                                                num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                                moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                                norm_topk_prob=True, tie_word_embeddings=False)),
    "qwen2.5-7B.sh": ("Qwen2Config", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                          num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                          rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False)),
}
# VL / omni script -> (outer config class, its text part's published values, outer published values,
# the text-only config class of the same layout). Sources: the published config.json files of
# Qwen/Qwen3-VL-4B-Instruct, Qwen/Qwen3-VL-30B-A3B-Instruct and Qwen/Qwen3-Omni-30B-A3B-Instruct.
QWEN3_VL_MOE = dict(QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                    num_key_value_heads=4, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
MULTIMODAL_CONFIGS = {
    "qwen3-vl-4B.sh": ("Qwen3VLConfig", dict(QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                             num_attention_heads=32, rope_theta=5e6),
                       dict(tie_word_embeddings=True), "Qwen3Config"),
    "qwen3-vl-30B-A3B.sh": ("Qwen3VLMoeConfig", dict(QWEN3_VL_MOE, rope_theta=5e6),
                            dict(tie_word_embeddings=False), "Qwen3MoeConfig"),
    "qwen3-omni-30B-A3B.sh": ("Qwen3OmniMoeConfig", dict(QWEN3_VL_MOE, vocab_size=152064, intermediate_size=768),
                              dict(tie_word_embeddings=False), "Qwen3MoeConfig"),
}
ALL_SCRIPTS = sorted(CONFIGS) + sorted(MULTIMODAL_CONFIGS)


def model_args(script: str) -> list[str]:
    path = os.path.join(ROOT, "scripts", "models", script)
    out = subprocess.run(["bash", "-c", f'source "{path}"; printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.split("\n") if line]


def _set_rope(config, rope):
    if rope is not None:  # transformers >= 5 keeps it under rope_parameters
        if getattr(config, "rope_parameters", None) is not None:
            config.rope_parameters["rope_theta"] = rope
        else:
            config.rope_theta = rope


def write_config(tmp_path, script: str, **override):
    import transformers

    if script in MULTIMODAL_CONFIGS:
        config = text_part_config(script, **override)
    else:
        cls, values = CONFIGS[script]
        values = {**values, **override}
        rope = values.pop("rope_theta", None)
        config = getattr(transformers, cls)(**values)
        _set_rope(config, rope)
    path = tmp_path / script.removesuffix(".sh")
    config.save_pretrained(path)
    return path, config


def multimodal_config(script: str, **override):
    """The published VL / omni config, built by its own transformers class."""
    import transformers

    cls, text_values, outer, _ = MULTIMODAL_CONFIGS[script]
    text_values = {**text_values, **override}
    rope = text_values.pop("rope_theta", None)
    if cls == "Qwen3OmniMoeConfig":
        config = transformers.Qwen3OmniMoeConfig(thinker_config=dict(text_config=text_values, **outer))
        _set_rope(config.thinker_config.text_config, rope)
    else:
        config = getattr(transformers, cls)(text_config=text_values, **outer)
        _set_rope(config.text_config, rope)
    return config


def text_part(config):
    """(the language model's config, its tie_word_embeddings) of a VL config or an omni config's thinker."""
    holder = getattr(config, "thinker_config", None) or config
    return holder.text_config, holder.tie_word_embeddings


def text_part_config(script: str, **override):
    """The text part of the published config as the text-only config class of the same layout."""
    import transformers

    text, tied = text_part(multimodal_config(script, **override))
    dropped = ("model_type", "architectures", "transformers_version")
    values = {k: v for k, v in text.to_dict().items() if k not in dropped}
    config = getattr(transformers, MULTIMODAL_CONFIGS[script][3])(**{**values, "tie_word_embeddings": tied})
    _set_rope(config, text.rope_parameters["rope_theta"])
    return config


def base(tmp_path, model) -> list[str]:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rollout-max-response-len", "8"]


def test_every_model_script_has_a_config():
    scripts = {f for f in os.listdir(os.path.join(ROOT, "scripts", "models")) if f.endswith(".sh")}
    assert scripts - {"tiny-qwen3.sh"} == set(ALL_SCRIPTS)


@pytest.mark.parametrize("script", ALL_SCRIPTS)
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_model_script_agrees_with_its_config(script, backend, tmp_path):
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    from relax.backends.megatron.convert import Layout
    from relax.backends.megatron.model import check_arch_flags

    path, config = write_config(tmp_path, script)
    cfg = parse_config(base(tmp_path, path) + ["--train-backend", backend] + model_args(script))
    flags = {f.name: getattr(cfg.megatron, f.name) for f in dataclasses.fields(cfg.megatron)}
    check_arch_flags(flags, Layout.from_hf_config(config), config, str(path))  # what the megatron worker runs


@pytest.mark.parametrize("script,override,needle", [
    ("qwen3-4B.sh", {"num_hidden_layers": 40}, "--num-layers 36 contradicts"),
    ("qwen3-30B-A3B.sh", {"num_experts_per_tok": 4}, "--moe-router-topk 8 contradicts"),
    ("qwen3-vl-4B.sh", {"num_hidden_layers": 40}, "--num-layers 36 contradicts"),
    ("qwen3-omni-30B-A3B.sh", {"moe_intermediate_size": 512}, "--moe-ffn-hidden-size 768 contradicts"),
])
def test_a_disagreeing_flag_fails(script, override, needle, tmp_path):
    path, _ = write_config(tmp_path, script, **override)
    with pytest.raises(ConfigError, match=needle):
        parse_config(base(tmp_path, path) + model_args(script))


@pytest.mark.parametrize("script", sorted(MULTIMODAL_CONFIGS))
def test_multimodal_text_part_keeps_the_published_values(script):
    # the text-only config the flags are checked against carries exactly the VL / omni text part
    text, tied = text_part(multimodal_config(script))
    flat = text_part_config(script)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "rms_norm_eps"):
        assert getattr(flat, key) == getattr(text, key) == {**QWEN3, **MULTIMODAL_CONFIGS[script][1]}[key], key
    assert flat.rope_parameters["rope_theta"] == text.rope_parameters["rope_theta"]
    assert flat.tie_word_embeddings == tied == MULTIMODAL_CONFIGS[script][2]["tie_word_embeddings"]


def test_a_disagreeing_rotary_base_fails_for_the_megatron_check(tmp_path):
    from relax.backends.megatron.convert import Layout
    from relax.backends.megatron.model import check_arch_flags

    bad = tmp_path / "bad"
    bad.mkdir()
    path, config = write_config(bad, "qwen3-vl-4B.sh", rope_theta=1e6)  # Qwen3-4B's, not Qwen3-VL-4B's
    with pytest.raises(ConfigError, match="--rotary-base 5000000"):  # the start-up check (rope_parameters)
        parse_config(base(tmp_path, path) + model_args("qwen3-vl-4B.sh"))
    good, _ = write_config(tmp_path, "qwen3-vl-4B.sh")
    cfg = parse_config(base(tmp_path, good) + model_args("qwen3-vl-4B.sh"))
    flags = {f.name: getattr(cfg.megatron, f.name) for f in dataclasses.fields(cfg.megatron)}
    with pytest.raises(ValueError, match="--rotary-base 5000000"):  # and the megatron builder's own
        check_arch_flags(flags, Layout.from_hf_config(config), config, str(path))


def test_a_disagreeing_expert_count_fails_at_start_up(tmp_path):
    """transformers 5 writes a MoE text config's expert count as `num_local_experts`; the start-up
    check reads it there, inside the VL config's text part."""
    path, _ = write_config(tmp_path, "qwen3-vl-30B-A3B.sh", num_experts=64)
    with pytest.raises(ConfigError, match="--num-experts 128 contradicts"):
        parse_config(base(tmp_path, path) + model_args("qwen3-vl-30B-A3B.sh"))


def test_group_query_attention_on_a_multi_head_checkpoint_fails_for_the_megatron_check(tmp_path):
    """--group-query-attention (every seed script sets it) states grouped K/V heads: a checkpoint with as
    many KV heads as heads contradicts it; the other always-built flags (--swiglu, ...) change nothing."""
    pytest.importorskip("megatron.core")
    from relax.backends.megatron.convert import Layout
    from relax.backends.megatron.model import check_arch_flags

    path, config = write_config(tmp_path, "qwen3-0.6B.sh", num_key_value_heads=16)  # 16 heads: MHA
    args = model_args("qwen3-0.6B.sh")
    at = args.index("--num-query-groups")
    args = args[:at] + args[at + 2:]  # (it would contradict the 16 KV heads first)
    cfg = parse_config(base(tmp_path, path) + ["--train-backend", "megatron"] + args)
    flags = {f.name: getattr(cfg.megatron, f.name) for f in dataclasses.fields(cfg.megatron)}
    with pytest.raises(ValueError, match="--group-query-attention True but .* says False"):
        check_arch_flags(flags, Layout.from_hf_config(config), config, str(path))
    check_arch_flags(flags | {"group_query_attention": False}, Layout.from_hf_config(config), config, str(path))


def test_a_checkpoint_without_swiglu_is_refused_by_the_megatron_backend(tmp_path):
    """The megatron backend builds silu-gated MLPs only: a gelu checkpoint is refused by name (auto picks
    fsdp for it), never built with silu."""
    from relax.backends.megatron.convert import ConversionError, Layout
    from relax.config.checks.megatron import megatron_unfit

    path, config = write_config(tmp_path, "qwen3-0.6B.sh", hidden_act="gelu")
    with pytest.raises(ConversionError, match="hidden_act=gelu: the megatron backend builds SwiGLU"):
        Layout.from_hf_config(config)
    cfg = parse_config(base(tmp_path, path))
    assert cfg.cluster.train_backend == "fsdp"  # auto
    assert any("hidden_act gelu" in r and "--train-backend fsdp" in r for r in megatron_unfit(cfg))
    if importlib.util.find_spec("megatron.core"):
        with pytest.raises(ConfigError, match="hidden_act gelu"):
            parse_config(base(tmp_path, path) + ["--train-backend", "megatron"])
