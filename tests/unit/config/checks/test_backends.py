"""Backend resolution and each backend's flags (`relax.config.checks.backends`): `auto` on a CPU
machine, the fsdp backend's recomputation, the model flags against the checkpoint,
--true-on-policy-mode's matching numerics, and the engine option check handed in by the
entrypoint (config imports no backend). SGLang's own checks:
tests/unit/backends/sglang_backend/test_sglang_backend_choice.py."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, machine, parse_config


@pytest.mark.parametrize("extra, needle", [
    (["--ref-actor-config", '{"tensor_parallel": 2}'], "unknown key(s) ['tensor_parallel']; it takes threads, "),
    (["--ref-actor-config", '{"threads": 0}'], "threads must be an integer >= 1"),
    (["--num-layers", "4"], "--num-layers 4 contradicts"),
    (["--some-megatron-flag"], "--some-megatron-flag: not Relax flags, and no training backend reads"),
    (["--recompute-granularity", "selective"], "use --recompute-granularity full"),
    (["--recompute-method", "block"], "need --recompute-granularity full"),
])
def test_bad_combinations_fail_naming_the_flag(base, extra, needle):
    with pytest.raises((ConfigError, SystemExit)) as err:
        parse_config(base + extra)
    if err.type is ConfigError:
        assert needle in str(err.value)


def test_auto_backends_resolve_to_cpu_backends(base):
    cfg = parse_config(base)
    assert (cfg.cluster.train_backend, cfg.cluster.rollout_backend) == ("fsdp", "hf")


def test_recompute_flags_reach_the_fsdp_ranks(base):
    from relax.components.training import recompute_layers

    assert recompute_layers(parse_config(base)) is None
    assert recompute_layers(parse_config(base + ["--recompute-granularity", "full"])) == -1
    assert recompute_layers(parse_config(base + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                                 "--recompute-num-layers", "1"])) == -1
    assert recompute_layers(parse_config(base + ["--recompute-granularity", "full", "--recompute-method", "block",
                                                 "--recompute-num-layers", "3"])) == 3


def test_true_on_policy_mode_is_accepted_with_cpu_backends(base):
    cfg = parse_config(base + ["--true-on-policy-mode", "--fully-async", "--max-staleness", "1"])
    assert cfg.cluster.true_on_policy_mode
    assert (cfg.cluster.train_backend, cfg.cluster.rollout_backend) == ("fsdp", "hf")


@pytest.mark.parametrize("extra, needle", [
    (["--train-backend", "megatron"], "--sglang-enable-deterministic-inference"),
    (["--rollout-backend", "sglang"], "--sglang-rl-on-policy-target fsdp"),
    (["--bf16"], "drop --bf16"),
    (["--engine-threads", "0"], "--engine-threads"),
    (["--ref-actor-config", '{"threads": 2}'], "--ref-actor-config threads=2"),
])
def test_true_on_policy_mode_rejects_mismatched_numerics(base, extra, needle):
    with pytest.raises(ConfigError, match="--true-on-policy-mode") as err:
        parse_config(base + ["--true-on-policy-mode"] + extra)
    assert needle in str(err.value)


def test_auto_train_backend_picks_megatron_with_a_gpu_unless_the_run_needs_fsdp(base, monkeypatch):
    pytest.importorskip("megatron.core")
    monkeypatch.setattr(machine, "local_gpus", lambda: 1)
    monkeypatch.setattr(machine, "sglang_installed", lambda: False)
    assert parse_config(base).cluster.train_backend == "megatron"
    assert parse_config(base + ["--fully-async"]).cluster.train_backend == "megatron"
    assert parse_config(base + ["--advantage-estimator", "ppo"]).cluster.train_backend == "megatron"
    ppo_pp = ["--advantage-estimator", "ppo", "--pipeline-model-parallel-size", "2"]
    assert parse_config(base + ppo_pp).cluster.train_backend == "fsdp"


def sglang_machine(monkeypatch) -> None:
    """sglang installed and a GPU visible: `--rollout-backend sglang` resolves, and its engine check runs."""
    monkeypatch.setattr(machine, "local_gpus", lambda: 1)
    monkeypatch.setattr(machine, "sglang_installed", lambda: True)
    monkeypatch.setattr(machine, "megatron_installed", lambda: False)


def test_the_engine_check_handed_in_judges_the_chosen_backends_options(base, monkeypatch):
    sglang_machine(monkeypatch)
    seen = []

    def engine_check(backend, cfg):
        seen.append((backend, dict(cfg.sglang)))
        raise ValueError("--sglang-bogus: not an option")

    with pytest.raises(ConfigError, match="^--sglang-bogus: not an option$"):
        parse_config(base + ["--rollout-backend", "sglang", "--sglang-bogus", "1"], engine_check=engine_check)
    assert seen == [("sglang", {"bogus": "1"})]


def test_without_an_engine_check_the_options_are_left_to_the_engines(base, monkeypatch):
    sglang_machine(monkeypatch)
    cfg = parse_config(base + ["--rollout-backend", "sglang", "--sglang-bogus", "1"])
    assert cfg.cluster.rollout_backend == "sglang" and cfg.sglang == {"bogus": "1"}


def test_the_hf_engine_has_no_option_check_to_call(base):
    def engine_check(backend, cfg):
        raise AssertionError(f"called for {backend}")

    assert parse_config(base, engine_check=engine_check).cluster.rollout_backend == "hf"
