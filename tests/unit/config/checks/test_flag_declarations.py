"""Every flag acts or says why not (`relax.config.checks.flags`).

A flag of the schema is either read by the code (outside the schema), or rejected when set
(`supported=False`, "not implemented"), or accepted with a logged reason (`ignored=...`). The
check below is static (the code must mention the field) plus behavioural for the other two kinds
(setting one must raise, or must produce its note)."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from relax.config import ConfigError, parse_config
from relax.config.checks.flags import check_unsupported, ignored_flag_notes
from relax.config.fields import choices_of, field_default, flag_name
from relax.config.plan import resolve_plan
from relax.config.schema import GROUPS, RelaxConfig

ROOT = Path(__file__).resolve().parents[4] / "relax"


SOURCES = {p: p.read_text() for p in ROOT.rglob("*.py") if p.name not in ("schema.py", "fields.py")}


FIELDS = [(group, f, typing.get_type_hints(cls)[f.name])
          for group, cls in GROUPS.items() for f in dataclasses.fields(cls)]


def other_value(f: dataclasses.Field, hint) -> object:
    """A value different from the field's default, of the field's type."""
    default, choices = field_default(f), choices_of(hint)
    if choices:
        return next(c for c in choices if c != default)
    if isinstance(default, bool) or f.metadata.get("type") and f.metadata["type"].__name__ == "bool":
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if f.metadata.get("nargs"):
        return ["x"]
    return {"k": 1} if f.metadata.get("type") and f.metadata["type"].__name__ == "json" else "x"


@pytest.mark.parametrize("group, f, hint", [x for x in FIELDS if x[1].metadata.get("supported", True)
                                            and not x[1].metadata.get("ignored")], ids=lambda x: getattr(x, "name", ""))
def test_every_acting_flag_is_read_by_the_code(group, f, hint):
    read = re.compile(rf"\.{f.name}\b")
    users = [str(p.relative_to(ROOT.parent)) for p, text in SOURCES.items() if read.search(text)]
    assert users, (f"{flag_name(f)} is neither read anywhere in relax/, nor marked supported=False (rejected when "
                   "set), nor ignored='why' (accepted with a logged reason): a silent flag")


@pytest.mark.parametrize("group, f, hint", [x for x in FIELDS if not x[1].metadata.get("supported", True)],
                         ids=lambda x: getattr(x, "name", ""))
def test_flags_not_built_are_rejected_when_set(group, f, hint):
    cfg = RelaxConfig().replace(**{f.name: other_value(f, hint)})
    with pytest.raises(ConfigError, match=re.escape(flag_name(f)) + ".*not implemented in this build"):
        check_unsupported(cfg)


@pytest.mark.parametrize("group, f, hint", [x for x in FIELDS if x[1].metadata.get("ignored")],
                         ids=lambda x: getattr(x, "name", ""))
def test_ignored_flags_are_reported_with_their_reason_when_set(group, f, hint):
    cfg = RelaxConfig().replace(**{f.name: other_value(f, hint)})
    notes = ignored_flag_notes(cfg)
    assert any(flag_name(f) in n and f.metadata["ignored"] in n for n in notes), notes
    assert ignored_flag_notes(RelaxConfig()) == []


def test_ignored_flags_reach_the_plan_notes(base):
    plan = resolve_plan(parse_config(base + ["--context-parallel-size", "2", "--get-mismatch-metrics"]))
    assert any("--context-parallel-size" in n for n in plan.notes)
    assert any("--get-mismatch-metrics" in n and "always reported" in n for n in plan.notes)


@pytest.mark.parametrize("flag, needle", [
    (["--polling-mode", "false"], "--polling-mode false asks for TransferQueue's blocking fetch"),
])
def test_unimplemented_flags_fail_instead_of_being_ignored(base, flag, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + flag)


def test_megatron_only_flags_are_reported_as_ignored_under_fsdp(base):
    cfg = parse_config(base + ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"])
    (note,) = ignored_flag_notes(cfg)
    assert note.startswith("--tensor-model-parallel-size --use-distributed-optimizer: accepted and ignored: applies to "
                           "the megatron training backend")
    assert ignored_flag_notes(parse_config(base)) == []


def test_megatron_flags_that_change_nothing_there_either_are_noted_under_megatron_too(base):
    """--swiglu asks for what the megatron backend always builds: noted with that reason, one note per
    reason; --group-query-attention acts there (checked against the checkpoint), so no note."""
    pytest.importorskip("megatron.core")
    cfg = parse_config(base + ["--train-backend", "megatron", "--swiglu", "--attention-softmax-in-fp32",
                               "--group-query-attention", "--model-name", "qwen3", "--tensor-model-parallel-size", "1"])
    notes = ignored_flag_notes(cfg)  # --model-name acts: it picks the converter family
    assert notes == ["--swiglu: accepted and ignored: the megatron backend always builds SwiGLU MLPs (a checkpoint "
                     "with another hidden_act is refused)",
                     "--attention-softmax-in-fp32: accepted and ignored: not read: attention is PyTorch SDPA, whose "
                     "kernels choose the softmax's precision"], notes
