"""Roles -> component classes, resolved once by dotted path (imported lazily in the process
that hosts them). Adding a role is one line here, one in `relax.config.roles.Role` and its
planner in `relax.config.role_plans`, plus its component file."""

from relax.config.role_plans import RolePlan
from relax.config.roles import Role

ROLES: dict[Role, str] = {
    Role.ACTOR: "relax.components.actor.Actor",
    Role.ROLLOUT: "relax.components.rollout.Rollout",
    Role.REFERENCE: "relax.components.actor_fwd.ActorFwd",
    Role.ACTOR_FWD: "relax.components.actor_fwd.ActorFwd",
    Role.ADVANTAGES: "relax.components.advantages.Advantages",
    Role.DCS: "relax.distributed.checkpoint_service.coordinator.Coordinator",
    Role.GENRM: "relax.components.genrm.GenRM",
    Role.CRITIC: "relax.components.critic.Critic",
    Role.TEACHER: "relax.components.teacher.Teacher",
    Role.METRICS: "relax.components.metrics.MetricsService",
}

# A role the plan deploys without workers where the class above needs them: a class that only
# does its part of the step (--debug-rollout-only: the Actor consumes steps untrained).
WITHOUT_WORKERS: dict[Role, str] = {
    Role.ACTOR: "relax.components.actor.UntrainedActor",
}


def component_path(role: RolePlan) -> str:
    """The component class that serves `role` as planned."""
    if not role.workers and role.name in WITHOUT_WORKERS:
        return WITHOUT_WORKERS[role.name]
    return ROLES[role.name]

