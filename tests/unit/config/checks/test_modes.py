"""The run's shape (`relax.config.checks.modes`): one mode, the flags it has no use for, the
debug modes, `--resource` and the batch sizes."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config


@pytest.mark.parametrize("extra, needle", [
    (["--colocate", "--fully-async"], "--fully-async"),
    (["--global-batch-size", "3"], "--global-batch-size 3 must divide"),
    (["--use-dynamic-batch-size"], "--max-tokens-per-gpu"),
    (["--resource", '{"actor": [1, 1]}'], "rollout"),
    (["--resource", '{"actor": [1, 1], "rolout": [1, 1]}'], "unknown role 'rolout'"),
    (["--resource", "{bad json"], "JSON"),
    (["--partial-rollout"], "--partial-rollout resumes requests that a weight update aborts"),
    (["--fully-async", "--mask-offpolicy-in-partial-rollout"], "only applies with --partial-rollout"),
    (["--fully-async", "--partial-rollout-max-aborted-count", "2"], "only applies with --partial-rollout"),
    (["--fully-async", "--partial-rollout", "--partial-rollout-max-aborted-count", "-1"], "must be >= 0"),
])
def test_bad_combinations_fail_naming_the_flag(base, extra, needle):
    with pytest.raises((ConfigError, SystemExit)) as err:
        parse_config(base + extra)
    if err.type is ConfigError:
        assert needle in str(err.value)


def test_unknown_resource_roles_are_listed_in_role_order(base):
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--resource", '{"actor": [1, 1], "rollout": [1, 1], "bogus": [1, 1]}'])
    assert str(err.value) == ("--resource: unknown role 'bogus'; known roles: actor, rollout, reference, actor_fwd, "
                              "advantages, critic, teacher, genrm")


@pytest.mark.parametrize("extra, needle", [
    (["--max-staleness", "2"], "--max-staleness 2 bounds how far rollout runs ahead"),
    (["--fully-async", "--offload"], "--offload: in fully-async mode"),
    (["--fully-async", "--offload-rollout"], "--offload-rollout: in fully-async mode"),
    (["--fully-async", "--use-rollout-entropy"], "--use-rollout-entropy computes entropies in the Actor's"),
])
def test_flags_the_mode_cannot_use_fail_with_the_fix(base, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + extra)


def test_partial_rollout_flags_are_accepted_in_fully_async_mode(base):
    cfg = parse_config(base + ["--fully-async", "--max-staleness", "1", "--partial-rollout",
                               "--partial-rollout-max-aborted-count", "2", "--mask-offpolicy-in-partial-rollout"])
    assert cfg.rollout.partial_rollout and cfg.rollout.partial_rollout_max_aborted_count == 2
    assert cfg.args.mask_offpolicy_in_partial_rollout


def test_num_steps_per_rollout_sets_global_batch(base):
    assert parse_config(base + ["--num-steps-per-rollout", "2"]).batch.global_batch_size == 4


@pytest.mark.parametrize("extra, needle", [
    (["--debug-rollout-only"], "drop --fully-async"),
    (["--max-staleness", "-1"], "--max-staleness must be >= 0"),
    (["--num-iters-per-train-update", "0"], "--num-iters-per-train-update must be >= 1"),
])
def test_fully_async_rejects_what_it_does_not_combine_with(base, extra, needle):
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--fully-async"] + extra)
    assert needle in str(err.value)


def test_fully_async_accepts_ref_update_interval_and_opd(base):
    cfg = parse_config(base + ["--fully-async", "--use-kl-loss", "--ref-update-interval", "2"])
    assert cfg.algo.ref_update_interval == 2
    cfg = parse_config(base + ["--fully-async", "--use-opd", "--opd-type", "sglang", "--rm-url", "http://x"])
    assert cfg.algo.use_opd and cfg.cluster.fully_async


def test_fully_async_accepts_ppo_with_a_critic(base):
    cfg = parse_config(base + ["--fully-async", "--max-staleness", "1", "--advantage-estimator", "ppo"])
    assert cfg.cluster.fully_async and not cfg.cluster.colocate


@pytest.mark.parametrize("value", ["0", "1"])
def test_colocate_takes_the_seeds_max_staleness_as_on_policy(base, value):
    """The customization guide's colocate script passes --max-staleness 0, the verl guide's 1
    ("strict on-policy"): both run on-policy, and 1 says so in the plan."""
    from relax.config.plan import resolve_plan

    plan = resolve_plan(parse_config(base + ["--colocate", "--max-staleness", value]))
    assert plan.mode == "colocate" and plan.actor.max_staleness == 0 and plan.rollout.max_staleness == 0
    noted = [n for n in plan.notes if "--max-staleness 1" in n]
    assert (noted != []) == (value == "1") and all("on-policy" in n for n in noted)
