"""The LoRA flags (`relax.config.lora`, `relax.config.checks.lora`): parsing as peft takes them, the
combinations a LoRA run refuses (each naming the flag and the fix), megatron refused with the fsdp fix
(and `auto` picking fsdp), and the plan: no Reference role, the actor scores the base model itself."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config
from relax.config.lora import LoraSpec, lora_spec, parse_targets
from relax.config.plan import format_plan, resolve_plan
from relax.config.roles import Role

KL = ["--use-kl-loss", "--kl-loss-coef", "0.05"]


def test_lora_flags_parse_as_peft_names_them(base):
    cfg = parse_config(base + ["--lora-rank", "8", "--lora-alpha", "32", "--lora-target-modules", "q_proj, v_proj",
                               "--lora-dropout", "0.05"])
    assert lora_spec(cfg) == LoraSpec(8, 32.0, ("q_proj", "v_proj"), 0.05) and lora_spec(cfg).scaling == 4.0
    assert lora_spec(parse_config(base)) is None  # --lora-rank 0: full fine-tuning
    assert lora_spec(parse_config(base + ["--lora-rank", "4"])).targets == ("all-linear",)
    assert cfg.args.lora_rank == 8  # plugins see them on args like every flag


@pytest.mark.parametrize("extra, needle", [
    (["--lora-rank", "-1"], "--lora-rank must be >= 0"),
    (["--lora-rank", "8", "--lora-alpha", "0"], "--lora-alpha must be > 0"),
    (["--lora-rank", "8", "--lora-dropout", "1.0"], "--lora-dropout must be in [0, 1)"),
    (["--lora-rank", "8", "--lora-target-modules", "all-linear,q_proj"], "give it alone"),
    (["--lora-rank", "8", "--lora-target-modules", " , "], "--lora-target-modules is empty"),
    (["--lora-rank", "8", "--train-backend", "megatron"], "use --train-backend fsdp"),
    (["--lora-rank", "8", *KL, "--ref-update-interval", "2"], "drop --ref-update-interval"),
    (["--lora-rank", "8", *KL, "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}'],
     "--resource reference"),
    (["--lora-rank", "8", *KL, "--fully-async"], "use --colocate or drop the KL"),
    (["--lora-rank", "8", "--only-train-params-name-list", "q_proj"], "only the adapters train"),
    (["--lora-rank", "8", "--debug-rollout-only"], "drop --lora-rank"),
])
def test_bad_lora_runs_fail_naming_the_flag_and_the_fix(base, extra, needle):
    with pytest.raises(ConfigError) as err:
        parse_config(base + extra)
    assert needle in str(err.value)


def test_lora_on_sglang_needs_the_built_in_router_and_colocate(base):
    """Checked on the resolved config: the rollout backend named, as `auto` would resolve it on a GPU."""
    from relax.config.lora import lora_conflicts

    cfg = parse_config(base + ["--lora-rank", "8"]).replace(rollout_backend="sglang")
    assert lora_conflicts(cfg) == []
    assert "--rollout-backend hf" in lora_conflicts(cfg.replace(fully_async=True, colocate=False))[0]
    assert "--sglang-router-ip" in lora_conflicts(cfg.replace(sglang_router_ip="10.0.0.1"))[0]


def test_auto_picks_fsdp_for_lora():
    from relax.config.checks.megatron import megatron_unfit
    from relax.config.schema import RelaxConfig

    assert "use --train-backend fsdp" in megatron_unfit(RelaxConfig().replace(lora_rank=8))[0]
    assert megatron_unfit(RelaxConfig()) == []


def test_the_reference_is_the_actor_with_the_adapter_off(base):
    plan = resolve_plan(parse_config(base + ["--lora-rank", "8", *KL]))
    assert not plan.has(Role.REFERENCE)
    assert "ref_log_probs" in plan.actor.computes and "ref_log_probs" not in plan.actor.reads
    assert "reference = the base model (adapter off)" in format_plan(plan, parse_config(base + ["--lora-rank", "8",
                                                                                                 *KL]))
    full = resolve_plan(parse_config(base + KL))  # without LoRA: the Reference role as before
    assert full.has(Role.REFERENCE) and "ref_log_probs" in full.actor.reads


def test_lora_flags_without_a_rank_get_a_note(base):
    plan = resolve_plan(parse_config(base + ["--lora-alpha", "32"]))
    assert any("--lora-alpha" in n and "--lora-rank > 0" in n for n in plan.notes)


def test_target_names_are_checked():
    assert parse_targets("q_proj,v_proj") == ("q_proj", "v_proj")
    assert parse_targets("q_proj v_proj") == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match="not a module name"):
        parse_targets("q_proj,v-proj!")
