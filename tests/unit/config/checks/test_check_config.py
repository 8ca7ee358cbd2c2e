"""`check_config` (`relax.config.checks`): every check in order, derived values in a new config,
and `parse_config` = the parser, then the checks."""

from __future__ import annotations

from relax.config import parse_config
from relax.config.checks import CHECKS, check_config
from relax.config.checks.backends import check_backends
from relax.config.checks.modes import check_batches, check_mode, check_resource
from relax.config.parser import parse_flags


def test_validation_returns_derived_values_without_touching_its_input(base):
    raw = parse_flags(base)
    derived = check_config(raw)
    assert raw.batch.global_batch_size is None and derived.batch.global_batch_size == 8
    assert raw.cluster.train_backend == "auto" and derived.cluster.train_backend == "fsdp"
    assert raw.cluster.resource is None and derived.cluster.resource == {"actor": [1, 1], "rollout": [1, 1]}


def test_checks_that_derive_run_before_those_that_read_what_they_derive():
    order = {check: i for i, check in enumerate(CHECKS)}
    assert order[check_mode] < order[check_resource] < order[check_batches] < order[check_backends]


def test_parse_config_without_validation_is_the_parsed_flags(base):
    assert parse_config(base, validate=False) == parse_flags(base)
