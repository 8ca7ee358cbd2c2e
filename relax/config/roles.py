"""The roles a run may deploy, by name, and the sets of them that flags and backends refer to.

`Role` is a `StrEnum`: a member equals its string (`Role.ACTOR == "actor"`), so `--resource`
JSON keys, Serve app names and log lines stay plain strings while the code names roles through
the type checker instead of string literals. Which roles a given run deploys, and with what,
is the run plan's business (`relax.config.role_plans`, `relax.config.plan`).
"""

from __future__ import annotations

import enum
from typing import Iterable


class Role(enum.StrEnum):
    """A deployable role (a Serve app of the run); the order is the order roles are listed in."""

    ACTOR = "actor"
    ROLLOUT = "rollout"
    REFERENCE = "reference"
    ACTOR_FWD = "actor_fwd"
    ADVANTAGES = "advantages"
    CRITIC = "critic"
    TEACHER = "teacher"
    GENRM = "genrm"
    DCS = "dcs"
    METRICS = "metrics"


# Roles a `--resource` entry may name (the DCS coordinator and the metrics service hold no workers).
RESOURCE_ROLES: frozenset[Role] = frozenset(Role) - {Role.DCS, Role.METRICS}
# Roles that may run training-backend ranks.
TRAINING_ROLES: frozenset[Role] = frozenset({Role.ACTOR, Role.REFERENCE, Role.CRITIC, Role.ACTOR_FWD, Role.TEACHER})


def in_order(roles: Iterable[Role]) -> tuple[Role, ...]:
    """`roles` in `Role`'s order (a set's own order is arbitrary; messages list roles stably)."""
    wanted = set(roles)
    return tuple(r for r in Role if r in wanted)
