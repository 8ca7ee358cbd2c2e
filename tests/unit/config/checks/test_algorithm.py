"""The algorithm's flags and the roles they deploy (`relax.config.checks.algorithm`): KL, the
critic, the OPD teacher."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config


@pytest.mark.parametrize("extra, needle", [
    (["--kl-coef", "0.1", "--use-kl-loss", "--kl-loss-coef", "0.1"], "--kl-coef"),
    (["--kl-loss-coef", "0.1"], "--use-kl-loss"),
    (["--eps-clip-c", "0.5"], "--eps-clip-c"),
])
def test_bad_combinations_fail_naming_the_flag(base, extra, needle):
    with pytest.raises((ConfigError, SystemExit)) as err:
        parse_config(base + extra)
    if err.type is ConfigError:
        assert needle in str(err.value)


def test_ppo_is_accepted_and_critic_flags_parse(base):
    cfg = parse_config(base + ["--advantage-estimator", "ppo", "--critic-lr", "1e-5", "--num-critic-only-steps", "2",
                               "--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 2]}'])
    assert cfg.algo.critic_lr == 1e-5 and cfg.algo.num_critic_only_steps == 2
    assert cfg.cluster.resource["critic"] == [1, 2]


@pytest.mark.parametrize("extra, needle", [
    (["--num-critic-only-steps", "2"], "--num-critic-only-steps configure the critic"),
    (["--critic-lr", "1e-5"], "--advantage-estimator ppo"),
    (["--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 1]}'], "--resource critic"),
    (["--advantage-estimator", "ppo", "--critic-save", "/tmp/c"], "add --save DIR"),
    (["--advantage-estimator", "ppo", "--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 3]}'],
     "divisible by the critic's 3"),
    (["--advantage-estimator", "on_policy_distillation"], "needs --use-opd"),
    (["--use-opd"], "--use-opd needs --opd-type"),
    (["--opd-type", "megatron"], "need --use-opd"),
    (["--use-opd", "--opd-type", "megatron"], "--opd-teacher-load"),
    (["--use-opd", "--opd-type", "sglang"], "--rm-url"),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-load", "/nonexistent"], "no config.json"),
    (["--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "0", "--rm-url", "http://x"], "--opd-kl-coef"),
    (["--ref-update-interval", "2"], "--use-kl-loss or --kl-coef"),
    (["--use-kl-loss", "--ref-update-interval", "0"], ">= 1"),
])
def test_algorithm_suite_flag_errors_name_the_fix(base, extra, needle):
    with pytest.raises(ConfigError, match=None) as err:
        parse_config(base + extra)
    assert needle in str(err.value)


def test_opd_teacher_as_external_engine_or_checkpoint(base, tmp_path):
    cfg = parse_config(base + ["--use-opd", "--opd-type", "sglang", "--rm-url", "http://127.0.0.1:1/generate"])
    assert cfg.algo.use_opd and cfg.algo.opd_teacher_load is None
    teacher = tmp_path / "model"  # the base fixture's model dir has a config.json
    cfg = parse_config(base + ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(teacher),
                               "--advantage-estimator", "on_policy_distillation"])
    assert cfg.algo.opd_type == "megatron"


def sft_loss(inputs, cfg):
    """A custom loss that needs no advantages (negative log-likelihood of the response)."""
    return -(inputs.logp * inputs.mask_BT).sum() / inputs.mask_BT.sum(), {}


def test_disabling_advantages_leaves_them_out_of_the_actor_s_step(base):
    from relax.config.plan import resolve_plan

    custom = ["--loss-type", "custom_loss", "--custom-loss-function-path", f"{__name__}.sft_loss"]
    plan = resolve_plan(parse_config(base + custom + ["--disable-compute-advantages-and-returns"]))
    assert "advantages" not in plan.actor.computes
    assert "advantages" in resolve_plan(parse_config(base + custom)).actor.computes


@pytest.mark.parametrize("extra, needle", [
    ([], "--loss-type policy_loss weighs every token by its advantage"),
    (["--loss-type", "custom_loss", "--custom-loss-function-path", f"{__name__}.sft_loss", "--fully-async"],
     "computes advantages in the Advantages role"),
])
def test_disabling_advantages_needs_a_loss_and_a_mode_without_them(base, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + ["--disable-compute-advantages-and-returns"] + extra)
