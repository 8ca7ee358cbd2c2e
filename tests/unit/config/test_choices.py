"""Named choices checked at parse time (`relax.config.choices`): a bad name fails before
anything starts, listing the valid names and the closest one."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config
from relax.config.choices import REWARD_TYPES


def test_the_reward_names_are_the_engine_registry_s():
    from relax.engine.rewards.registry import REWARD_TYPES as ENGINE

    assert sorted(REWARD_TYPES) == sorted(ENGINE)


@pytest.mark.parametrize("value", ["math", "openr1mm", "boxed_f1", "boxed_multiple_choice", "remote_rm"])
def test_known_reward_types_parse(value):
    assert parse_config(["--rm-type", value], validate=False).reward.rm_type == value


@pytest.mark.parametrize("value, needle", [
    ("maths", "unknown reward type 'maths' (choose from dapo, deepscaler"),
    ("maths", "did you mean math?"),
    ("boxed_remote_rm", "the boxed_ prefix applies to sync reward types only"),
    ("boxed_mathh", "did you mean boxed_math?"),
])
def test_unknown_reward_types_fail_at_parse_time(capsys, value, needle):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--rm-type", value], validate=False)
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


def test_the_yaml_path_checks_the_same_names(base, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rm_type: maths\n")
    with pytest.raises(ConfigError, match="rm_type: unknown reward type 'maths'.*did you mean math"):
        parse_config(base + ["--custom-config-path", str(path)])


@pytest.mark.parametrize("flag, value, close", [("--advantage-estimator", "grpoo", "grpo"),
                                                ("--train-backend", "fsdb", "fsdp"),
                                                ("--rollout-backend", "sglan", "sglang")])
def test_literal_choices_suggest_the_closest(capsys, flag, value, close):
    with pytest.raises(SystemExit):
        parse_config([flag, value], validate=False)
    assert f"did you mean {close}?" in capsys.readouterr().err
