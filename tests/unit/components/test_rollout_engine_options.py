"""The Rollout role's engine launch options: the context limit, the true on-policy target, and
where the engines run (their GPU slots on a GPU cluster, the CPU otherwise)."""

from __future__ import annotations

from types import SimpleNamespace

from relax.backends.hf.launcher import engine_option_args
from relax.components.rollout import Rollout, engine_options
from relax.config.plan import resolve_plan
from relax.config.schema import RelaxConfig


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


def engines_cfg(n: int) -> RelaxConfig:
    return RelaxConfig().replace(resource={"actor": [1, 1], "rollout": [1, n]}, rollout_batch_size=1,
                                 rollout_backend="hf")


def test_engines_hold_gpu_shares_only_on_a_gpu_cluster():
    assert resolve_plan(engines_cfg(3), gpus=8).role("rollout").gpus == 1.5  # shared with the actor (0.5 each)
    assert resolve_plan(engines_cfg(3), gpus=0).role("rollout").gpus == 0


def test_engines_run_on_the_cpu_without_gpu_slots():
    cfg = engines_cfg(2)
    rollout = Rollout(cfg, resolve_plan(cfg, gpus=0).rollout)
    assert rollout._fleet_spec().devices == ("cpu", "cpu") and rollout.weight_receivers().devices == []
