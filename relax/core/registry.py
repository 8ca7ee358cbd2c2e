"""Roles -> component classes, resolved once by dotted path (imported lazily in the process
that hosts them). Adding a role is one line here plus its component file."""

ROLES: dict[str, str] = {
    "actor": "relax.components.actor.Actor",
    "rollout": "relax.components.rollout.Rollout",
    "reference": "relax.components.actor_fwd.ActorFwd",
    "actor_fwd": "relax.components.actor_fwd.ActorFwd",
    "advantages": "relax.components.advantages.Advantages",
    "dcs": "relax.distributed.checkpoint_service.coordinator.Coordinator",
    "genrm": "relax.components.genrm.GenRM",
    "critic": "relax.components.critic.Critic",
    "teacher": "relax.components.teacher.Teacher",
    "metrics": "relax.components.metrics.MetricsService",
}
