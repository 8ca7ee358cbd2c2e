"""Each role's plan from its own planner (`relax.config.role_plans`): one planner per role, in
deploy order; None for a role the config does not deploy; a role's part in a step (`StepPart`)
follows the mode and the flags."""

from __future__ import annotations

from relax.config import parse_config
from relax.config.role_plans import (
    ROLE_PLANNERS, StepPart, plan_actor_fwd, plan_critic, plan_reference, plan_roles, plan_rollout,
)
from relax.config.roles import Role


def test_one_planner_per_role_in_deploy_order():
    assert list(ROLE_PLANNERS) == [Role.METRICS, Role.GENRM, Role.ACTOR, Role.ROLLOUT, Role.REFERENCE, Role.TEACHER,
                                   Role.CRITIC, Role.ACTOR_FWD, Role.ADVANTAGES, Role.DCS]


def test_a_role_the_config_does_not_deploy_has_no_plan(base):
    cfg = parse_config(base)
    assert [r.name for r in plan_roles(cfg, "cpu")] == [Role.ACTOR, Role.ROLLOUT, Role.DCS]
    assert plan_reference(cfg, "cpu") is None and plan_critic(cfg, "cpu") is None and plan_actor_fwd(cfg, "cpu") is None


def test_a_roles_part_in_a_step_follows_the_mode(base):
    colocate = parse_config(base + ["--advantage-estimator", "ppo"])
    fully_async = parse_config(base + ["--advantage-estimator", "ppo", "--fully-async"])
    assert plan_critic(colocate, "cpu").parts == StepPart.SCORES | StepPart.TRAINS_AFTER_ACTOR | StepPart.CHECKPOINTS
    assert plan_critic(fully_async, "cpu").parts == (StepPart.STREAMS | StepPart.TRAINS_AFTER_ACTOR
                                                     | StepPart.CHECKPOINTS)
    assert plan_rollout(colocate, "cpu").parts == StepPart.RECEIVES_WEIGHTS | StepPart.CHECKPOINTS
    assert plan_actor_fwd(fully_async, "cpu").parts == StepPart.STREAMS | StepPart.RECEIVES_WEIGHTS


def test_replayed_rollouts_launch_no_engine_and_push_no_weights(base, tmp_path):
    cfg = parse_config(base + ["--load-debug-rollout-data", str(tmp_path / "rollout_{rollout_id}.pt")])
    rollout = plan_rollout(cfg, "cpu")
    assert rollout.workers == 0 and rollout.unit == "" and rollout.parts == StepPart.CHECKPOINTS


def test_a_refreshed_reference_receives_every_nth_weight_version(base):
    from relax.config.plan import format_plan, resolve_plan

    fixed = parse_config(base + ["--use-kl-loss"])
    assert StepPart.RECEIVES_WEIGHTS not in plan_reference(fixed, "cpu").parts
    refreshed = parse_config(base + ["--use-kl-loss", "--ref-update-interval", "3"])
    reference = plan_reference(refreshed, "cpu")
    assert StepPart.RECEIVES_WEIGHTS in reference.parts and reference.weights_every == 3
    plan = resolve_plan(refreshed)
    assert plan.weight_receivers == (Role.ROLLOUT, Role.REFERENCE)
    assert "weights: actor rank 0 -> rollout, reference (every 3 versions) through the DCS coordinator" in \
        format_plan(plan)
