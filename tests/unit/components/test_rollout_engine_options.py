"""The Rollout role's engine launch options: the context limit and the true on-policy target."""

from __future__ import annotations

from types import SimpleNamespace

from relax.backends.hf.launcher import engine_option_args
from relax.components.rollout import engine_options


def _cfg(true_on_policy: bool, sglang: dict | None = None):
    return SimpleNamespace(cluster=SimpleNamespace(true_on_policy_mode=true_on_policy, rollout_backend="hf"),
                           sglang=dict(sglang or {}))


def test_plain_run_passes_only_the_context_limit():
    assert engine_options(_cfg(False), 300) == {"max_context_len": 300}
    assert engine_options(_cfg(False), None) is None


def test_true_on_policy_launches_float32_engines_with_the_fsdp_target():
    options = engine_options(_cfg(True), None)
    assert options == {"rl_on_policy_target": "fsdp", "dtype": "float32"}
    assert engine_option_args(options) == ["--rl-on-policy-target", "fsdp", "--dtype", "float32"]


def test_sglang_passthrough_reaches_the_engines_only_for_options_they_have():
    options = engine_options(_cfg(False, {"max_running_requests": "4", "mem_fraction_static": "0.8"}), None)
    assert options == {"max_running_requests": "4"}  # SGLang's memory pool means nothing to hf
