"""Every flag acts or says why not, and the command line and YAML share one coercion.

A flag of the schema is either read by the code (outside the schema), or rejected when set
(`supported=False`, "not implemented"), or accepted with a logged reason (`ignored=...`). The
check below is static (the code must mention the field) plus behavioural for the other two kinds
(setting one must raise, or must produce its note)."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

import pytest

from relax.config import ConfigError, parse_config
from relax.config.fields import choices_of, field_default, flag_name
from relax.config.plan import resolve_plan
from relax.config.schema import GROUPS, RelaxConfig
from relax.config.validate import ignored_flag_notes

ROOT = Path(__file__).resolve().parents[3] / "relax"
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


@pytest.fixture()
def base(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "3", "--rollout-max-response-len", "8",
            "--exp-dir", str(tmp_path / "run")]


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
    from relax.config.validate import check_unsupported

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


# ---- YAML and the command line: one coercion ---------------------------------------------------

def write_yaml(tmp_path, text: str) -> str:
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    return str(path)


def test_yaml_values_are_coerced_like_the_command_line(base, tmp_path):
    yaml = write_yaml(tmp_path, 'n_samples_per_prompt: "4"\nupdate_weight_buffer_size: 64MB\nlr: 1e-4\n'
                                'resource: {"actor": [1, 1], "rollout": [1, 2]}\nrollout_stop_token_ids: [3, "4"]\n'
                                "progress_bar: 'false'\nmy_plugin_key: 7\n")
    cfg = parse_config(base + ["--custom-config-path", yaml])
    assert cfg.rollout.n_samples_per_prompt == 4 and cfg.rollout.update_weight_buffer_size == 64 << 20
    assert cfg.optim.lr == 1e-4 and cfg.cluster.resource["rollout"] == [1, 2]
    assert cfg.rollout.rollout_stop_token_ids == [3, 4] and cfg.logging.progress_bar is False
    assert cfg.args.my_plugin_key == 7 and cfg.custom == {"my_plugin_key": 7}
    assert cfg.batch.global_batch_size == 4 * 4  # derived after the YAML, from its value


@pytest.mark.parametrize("yaml, needle", [
    ("advantage_estimator: grpoo\n", "advantage_estimator: invalid choice 'grpoo' (choose from grpo, gspo"),
    ("n_samples_per_prompt: four\n", "n_samples_per_prompt: expected an integer, got 'four'"),
    ("n_samples_per_prompt: 2.5\n", "n_samples_per_prompt: expected int, got float 2.5"),
    ("use_kl_loss: maybe\n", "use_kl_loss: expected true/false, got 'maybe'"),
    ("lr: [1]\n", "lr: expected float, got list [1]"),
    ("rollout_batch_size: null\n", None),  # None for a required flag: the validation error names it
])
def test_bad_yaml_values_name_the_key_the_file_and_what_was_expected(base, tmp_path, yaml, needle):
    path = write_yaml(tmp_path, yaml)
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--custom-config-path", path])
    if needle is None:
        assert "--rollout-batch-size is required" in str(err.value)
    else:
        assert needle in str(err.value) and path in str(err.value) and "fix the value in the file" in str(err.value)


def test_the_same_bad_value_on_the_command_line_gets_the_same_message(base, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(base + ["--advantage-estimator", "grpoo"])
    assert exit_info.value.code == 2
    assert "invalid choice 'grpoo' (choose from grpo, gspo" in capsys.readouterr().err


def test_yaml_that_is_not_a_mapping_or_not_yaml_is_named(base, tmp_path):
    for text, needle in (("- a\n- b\n", "expected a mapping"), ("a: [unclosed\n", "not valid YAML")):
        with pytest.raises(ConfigError, match=needle):
            parse_config(base + ["--custom-config-path", write_yaml(tmp_path, text)])


def test_config_groups_are_frozen_and_replace_returns_a_new_config():
    cfg = RelaxConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.n_samples_per_prompt = 3  # type: ignore[misc]
    other = cfg.replace(n_samples_per_prompt=3, lr=0.5)
    assert (other.rollout.n_samples_per_prompt, other.optim.lr) == (3, 0.5)
    assert (cfg.rollout.n_samples_per_prompt, cfg.optim.lr) == (1, 1e-6)
    with pytest.raises(AttributeError, match="no field 'nope'"):
        cfg.replace(nope=1)


def test_validation_returns_derived_values_without_touching_its_input(base):
    from relax.config.parser import build_parser, config_from_namespace
    from relax.config.validate import validate_config

    ns, _ = build_parser().parse_known_args(base)
    raw = config_from_namespace(ns)
    derived = validate_config(raw)
    assert raw.batch.global_batch_size is None and derived.batch.global_batch_size == 8
    assert raw.cluster.train_backend == "auto" and derived.cluster.train_backend == "fsdp"
    assert raw.cluster.resource is None and derived.cluster.resource == {"actor": [1, 1], "rollout": [1, 1]}
