"""The roles by name (`relax.config.roles`): a `Role` is its string to JSON, Serve and logs, every
role has a component, and the role sets that flags and backends refer to."""

from __future__ import annotations

import json

from relax.config.roles import RESOURCE_ROLES, TRAINING_ROLES, Role, in_order
from relax.core.registry import ROLES


def test_a_role_is_its_string_wherever_a_string_was_used():
    assert Role.ACTOR == "actor" and f"{Role.ACTOR_FWD:<10}|" == "actor_fwd |" and Role("teacher") is Role.TEACHER
    assert {"critic": [1, 2]}[Role.CRITIC] == [1, 2] and json.dumps({Role.GENRM: 1}) == '{"genrm": 1}'


def test_every_role_has_a_component_and_only_the_workerless_ones_have_no_resource_entry():
    assert set(ROLES) == set(Role)
    assert set(Role) - RESOURCE_ROLES == {Role.DCS, Role.METRICS}


def test_training_roles_may_be_given_resources_and_list_in_role_order():
    assert TRAINING_ROLES <= RESOURCE_ROLES
    assert in_order(TRAINING_ROLES) == (Role.ACTOR, Role.REFERENCE, Role.ACTOR_FWD, Role.CRITIC, Role.TEACHER)
