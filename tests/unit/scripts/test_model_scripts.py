"""scripts/models/*.sh agree with the HF config of the model they name.

Each script's MODEL_ARGS (read by bash itself) are parsed with the real flag parser against a
config.json generated from transformers' config class with the published model's values, under
both backends; the megatron backend's own check (`check_arch_flags`) reads the same config as
the worker does. A flag that disagrees must fail."""

from __future__ import annotations

import dataclasses
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


def model_args(script: str) -> list[str]:
    path = os.path.join(ROOT, "scripts", "models", script)
    out = subprocess.run(["bash", "-c", f'source "{path}"; printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.split("\n") if line]


def write_config(tmp_path, script: str, **override):
    import transformers

    cls, values = CONFIGS[script]
    values = {**values, **override}
    rope = values.pop("rope_theta", None)
    config = getattr(transformers, cls)(**values)
    if rope is not None:  # transformers >= 5 keeps it under rope_parameters
        if getattr(config, "rope_parameters", None) is not None:
            config.rope_parameters["rope_theta"] = rope
        else:
            config.rope_theta = rope
    path = tmp_path / script.removesuffix(".sh")
    config.save_pretrained(path)
    return path, config


def base(tmp_path, model) -> list[str]:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rollout-max-response-len", "8"]


def test_every_model_script_has_a_config():
    scripts = {f for f in os.listdir(os.path.join(ROOT, "scripts", "models")) if f.endswith(".sh")}
    assert scripts - {"tiny-qwen3.sh"} == set(CONFIGS)


@pytest.mark.parametrize("script", sorted(CONFIGS))
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
])
def test_a_disagreeing_flag_fails(script, override, needle, tmp_path):
    path, _ = write_config(tmp_path, script, **override)
    with pytest.raises(ConfigError, match=needle):
        parse_config(base(tmp_path, path) + model_args(script))
