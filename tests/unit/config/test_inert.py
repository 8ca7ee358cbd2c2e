"""Flags that act only with another flag get a plan note when set without it (`relax.config.inert`),
shown by `--dry-run`; with the enabling flag they act and the note is gone."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from relax.config import parse_config
from relax.config.fields import choices_of, field_default, flag_for
from relax.config.inert import INERT, inert_flags
from relax.config.plan import format_plan, resolve_plan
from relax.config.schema import FIELD_GROUP, GROUPS, RelaxConfig


def other_value(name: str) -> object:
    cls = GROUPS[FIELD_GROUP[name]]
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    default, choices = field_default(f), choices_of(typing.get_type_hints(cls)[name])
    if choices:
        return next(c for c in choices if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 3
    return {"k": 1} if f.metadata.get("type") and f.metadata["type"].__name__ == "json" else "x"


def test_there_are_at_least_25_and_each_is_a_flag():
    assert len(INERT) >= 25 and set(INERT) <= set(FIELD_GROUP)


# what the default config enables that the flag needs turned off to be inert
DEFAULT_ENABLES = {"disable_grpo_std_normalization": {"advantage_estimator": "reinforce_plus_plus"}}


@pytest.mark.parametrize("name", sorted(n for n in INERT if n != "micro_batch_size"))
def test_each_set_alone_is_named_with_what_enables_it(name):
    found = inert_flags(RelaxConfig().replace(**{name: other_value(name)}, **DEFAULT_ENABLES.get(name, {})))
    needs = INERT[name][0]
    assert flag_for(name) in found.get(needs, []), found
    assert inert_flags(RelaxConfig()) == {}


# (flag and value, the enabling flags): set together, the flag acts and there is no note
ENABLED = [
    (["--tis-clip", "3"], ["--use-tis"]),
    (["--lr-decay-iters", "10"], ["--lr-decay-style", "cosine"]),
    (["--gamma", "0.9"], ["--advantage-estimator", "reinforce_plus_plus"]),
    (["--max-tokens-per-gpu", "64"], ["--use-dynamic-batch-size"]),
    (["--tb-experiment-name", "x"], ["--use-tensorboard"]),
    (["--opsm-delta", "0.1"], ["--use-opsm"]),
]


@pytest.mark.parametrize("flag, enabling", ENABLED, ids=lambda x: x[0])
def test_the_dry_run_notes_it_alone_and_not_with_its_enabling_flag(base, flag, enabling):
    alone = format_plan(resolve_plan(cfg := parse_config(base + flag)), cfg)
    assert f"note: {flag[0]}: no effect in this run; acts only with {enabling[0]}" in alone
    together = resolve_plan(parse_config(base + flag + enabling))
    assert not any(flag[0] in n for n in together.notes)


def test_micro_batch_size_is_noted_under_dynamic_batching(base):
    plan = resolve_plan(parse_config(base + ["--micro-batch-size", "2", "--use-dynamic-batch-size",
                                             "--max-tokens-per-gpu", "64"]))
    assert any(n.startswith("--micro-batch-size: no effect") for n in plan.notes)
