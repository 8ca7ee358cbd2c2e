"""The Rollout role's engine launch options: the context limit, the true on-policy target, LoRA, and
where the engines run (their GPU slots on a GPU cluster, the CPU otherwise)."""

from __future__ import annotations

from types import SimpleNamespace

from relax.backends.hf.launcher import engine_option_args
from relax.components.engine_launch import engine_options
from relax.components.rollout import Rollout
from relax.config.lora import LoraConfig
from relax.config.plan import resolve_plan
from relax.config.schema import RelaxConfig


def _cfg(true_on_policy: bool, sglang: dict | None = None, r3: bool = False):
    return SimpleNamespace(cluster=SimpleNamespace(true_on_policy_mode=true_on_policy, rollout_backend="hf"),
                           sglang=dict(sglang or {}), lora=LoraConfig(),
                           algo=SimpleNamespace(use_rollout_routing_replay=r3))


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


def test_r3_engines_record_routed_experts():
    """--use-rollout-routing-replay: SGLang's --enable-return-routed-experts, for the hf engine too (docs/moe.md)."""
    options = engine_options(_cfg(False, r3=True), None)
    assert options == {"enable_return_routed_experts": True}
    assert engine_option_args(options) == ["--enable-return-routed-experts"]


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


def lora_cfg(backend: str) -> RelaxConfig:
    return engines_cfg(1).replace(lora_rank=8, lora_alpha=32, lora_target_modules="all-linear",
                                  rollout_backend=backend)


def test_lora_engines_start_with_adapters_the_pushes_fill():
    """hf: SGLang's three LoRA options and the hf engine's alpha; sglang: no alpha (SGLang reads it from
    adapter_config.json), all-linear spelled as SGLang's `all`, and every request names the adapter."""
    from relax.backends.sglang.launcher import engine_command
    from relax.components.engine_launch import generate_defaults

    hf = engine_options(lora_cfg("hf"), None)
    assert hf == {"enable_lora": True, "max_lora_rank": 8, "lora_target_modules": ["all-linear"], "lora_alpha": 32.0}
    assert engine_option_args(hf) == ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "all-linear",
                                      "--lora-alpha", "32.0"]
    argv, _ = engine_command("/m", host="127.0.0.1", port=1, device="cuda:0",
                             options=engine_options(lora_cfg("sglang"), None))
    assert argv[argv.index("--enable-lora"):][:5] == ["--enable-lora", "--max-lora-rank", "8",
                                                      "--lora-target-modules", "all"]
    assert "--lora-alpha" not in argv
    assert generate_defaults(lora_cfg("sglang")) == {"lora_path": "relax-policy"}
    assert generate_defaults(lora_cfg("hf")) is None and generate_defaults(engines_cfg(1)) is None
