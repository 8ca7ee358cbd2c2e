"""`--rollout-backend sglang|auto`: sglang runs where it is installed and a GPU is visible, an
error says exactly what is missing, `auto` falls back to hf and logs why, and every `--sglang-*`
option is judged by SGLang's own parser before anything launches (the check the entrypoint hands
to `parse_config`: `relax.backends.registry.check_engine_options`)."""

from __future__ import annotations

import json
import logging

import pytest

from relax.backends.registry import check_engine_options
from relax.config import ConfigError, parse_config
from relax.config import machine as host

CHECKS = "relax.config.checks.backends"  # the logger of backend resolution


@pytest.fixture()
def base(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "head_dim": 16}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "3", "--rollout-max-response-len", "8"]


def machine(monkeypatch, *, gpus: int, installed: bool) -> None:
    monkeypatch.setattr(host, "local_gpus", lambda: gpus)
    monkeypatch.setattr(host, "sglang_installed", lambda: installed)


def test_sglang_without_a_gpu_says_so_and_points_to_hf(base, monkeypatch):
    machine(monkeypatch, gpus=0, installed=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--rollout-backend", "sglang"])
    message = str(err.value)
    assert "--rollout-backend sglang cannot run here: no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES=," in message
    assert "SGLang needs one; use --rollout-backend hf on CPU" in message and "not installed" not in message


def test_sglang_not_installed_says_which_package(base, monkeypatch):
    machine(monkeypatch, gpus=1, installed=False)
    with pytest.raises(ConfigError, match=r"sglang is not installed: pip install 'sglang\[all\]'") as err:
        parse_config(base + ["--rollout-backend", "sglang"])
    assert "GPU" not in str(err.value)


def test_both_missing_are_both_named(base, monkeypatch):
    machine(monkeypatch, gpus=0, installed=False)
    with pytest.raises(ConfigError, match="sglang is not installed.*; no NVIDIA GPU is visible"):
        parse_config(base + ["--rollout-backend", "sglang"])


def test_auto_uses_hf_and_logs_what_sglang_lacks(base, monkeypatch, caplog):
    machine(monkeypatch, gpus=0, installed=True)
    with caplog.at_level(logging.INFO, logger=CHECKS):
        cfg = parse_config(base, engine_check=check_engine_options)
    assert cfg.cluster.rollout_backend == "hf"
    assert "--rollout-backend auto -> hf (sglang: no NVIDIA GPU is visible" in caplog.text


def test_auto_picks_sglang_when_installed_with_a_gpu(base, monkeypatch, caplog):
    machine(monkeypatch, gpus=1, installed=True)
    checked = []
    with caplog.at_level(logging.INFO, logger=CHECKS):
        cfg = parse_config(base, engine_check=lambda backend, cfg: checked.append(backend))
    assert cfg.cluster.rollout_backend == "sglang" and len(checked) == 1  # its options were checked
    assert "--rollout-backend auto -> sglang (sglang is installed and a GPU is visible)" in caplog.text


def test_auto_keeps_hf_for_true_on_policy_mode(base, monkeypatch):
    machine(monkeypatch, gpus=1, installed=True)
    cfg = parse_config(base + ["--true-on-policy-mode", "--fully-async", "--max-staleness", "1"])
    assert cfg.cluster.rollout_backend == "hf"


def test_a_parser_that_does_not_import_fails_sglang_and_sends_auto_to_hf(base, monkeypatch, caplog):
    machine(monkeypatch, gpus=1, installed=True)

    def broken(backend, cfg):
        raise ImportError("sglang's argument parser does not import: No module named 'triton'")
    with pytest.raises(ConfigError, match="sglang cannot run here: .*No module named 'triton'"):
        parse_config(base + ["--rollout-backend", "sglang"], engine_check=broken)
    with caplog.at_level(logging.INFO, logger=CHECKS):
        assert parse_config(base, engine_check=broken).cluster.rollout_backend == "hf"
    assert "--rollout-backend auto -> hf (sglang: sglang's argument parser does not import" in caplog.text
    assert "No module named 'triton'" in caplog.text


@pytest.mark.parametrize("flags, needle", [
    (["--sglang-tp-size", "4", "--rollout-num-gpus-per-engine", "2"],
     "--sglang-tp-size 4 contradicts --rollout-num-gpus-per-engine 2"),
    (["--sglang-api-key", "k"], "--sglang-api-key: Relax sets --api-key per engine"),
])
def test_options_relax_owns_fail_before_sglangs_parser_runs(base, monkeypatch, flags, needle):
    machine(monkeypatch, gpus=1, installed=True)
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + ["--rollout-backend", "sglang"] + flags, engine_check=check_engine_options)


def test_a_typo_in_an_sglang_option_fails_at_config_time(base, monkeypatch, sglang_parser):
    machine(monkeypatch, gpus=1, installed=True)
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--rollout-backend", "sglang", "--sglang-mem-fraction-statik", "0.8"],
                     engine_check=check_engine_options)
    assert "--sglang-mem-fraction-statik" in str(err.value) and "--sglang-mem-fraction-static?" in str(err.value)
