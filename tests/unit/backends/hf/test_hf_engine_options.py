"""Engine options (`--genrm-engine-config`, context limits) -> hf server flags."""

from __future__ import annotations

import pytest

from relax.backends.hf import launcher
from relax.backends.hf.launcher import engine_option_args


def test_known_options_become_server_flags():
    assert engine_option_args({"max_context_len": 128, "dtype": "float32"}) == [
        "--max-context-len", "128", "--dtype", "float32"]
    assert engine_option_args({"context_length": 64}) == ["--max-context-len", "64"]
    assert engine_option_args(None) == []


def test_sglang_only_options_are_ignored_with_a_warning(monkeypatch):
    warned = []
    monkeypatch.setattr(launcher.logger, "warning", lambda msg, *args: warned.append(msg % args))
    assert engine_option_args({"dp_size": 1, "mem_fraction_static": 0.8}) == []
    assert len(warned) == 2 and "'dp_size' applies to SGLang only" in warned[0]


def test_kv_cache_and_cuda_graph_options_become_server_flags():
    """SGLang's --max-total-tokens, --disable-cuda-graph and --cuda-graph-max-bs act on the hf
    engine's slot cache (static_cache.py); the boolean one is a bare flag, given only when true."""
    assert engine_option_args({"max_total_tokens": 8192, "cuda_graph_max_bs": 64}) == [
        "--max-total-tokens", "8192", "--cuda-graph-max-bs", "64"]
    assert engine_option_args({"disable_cuda_graph": True}) == ["--disable-cuda-graph"]
    assert engine_option_args({"disable_cuda_graph": False}) == []
    from relax.backends.hf.server import parse_args

    args = parse_args(["--model-path", "m", "--max-total-tokens", "8192", "--disable-cuda-graph"])
    assert args.max_total_tokens == 8192 and args.disable_cuda_graph and args.cuda_graph_max_bs is None


def test_unknown_option_is_an_error_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown engine option 'max_len'.*max_context_len"):
        engine_option_args({"max_len": 1})


def test_rl_on_policy_target_becomes_the_server_flag():
    assert engine_option_args({"rl_on_policy_target": "fsdp"}) == ["--rl-on-policy-target", "fsdp"]


def test_engine_rejects_an_unknown_rl_on_policy_target(tiny_model_dir):
    from relax.backends.hf.engine import HFEngine

    with pytest.raises(ValueError, match="--rl-on-policy-target must be one of \\['fsdp'\\]"):
        HFEngine(str(tiny_model_dir), rl_on_policy_target="megatron")


def test_load_format_dummy_builds_random_weights_from_the_config_alone(tiny_model_dir, tmp_path):
    """SGLang's `--load-format dummy`: config.json and the tokenizer suffice (no weight files);
    the model has the checkpoint's shapes and different (random) values."""
    import shutil

    import torch

    from relax.backends.hf.engine import HFEngine

    assert engine_option_args({"load_format": "dummy"}) == ["--load-format", "dummy"]
    config_only = tmp_path / "config-only"
    shutil.copytree(tiny_model_dir, config_only,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.index.json"))
    dummy = HFEngine(str(config_only), load_format="dummy")
    real = HFEngine(str(tiny_model_dir))
    assert dummy.load_format == "dummy"
    shapes = {n: p.shape for n, p in real.model.named_parameters()}
    assert {n: p.shape for n, p in dummy.model.named_parameters()} == shapes
    assert any(not torch.equal(p, dict(real.model.named_parameters())[n]) for n, p in dummy.model.named_parameters())
    with pytest.raises(ValueError, match="--load-format must be one of \\['auto', 'dummy'\\], got 'pt'"):
        HFEngine(str(tiny_model_dir), load_format="pt")
