"""The CLI helps (`relax.config.help`, `relax.config.parser`): `--help` is one screen of groups,
`--help GROUP` one group, `--help-all` everything; booleans take the seeds' spellings; unknown
flags get a did-you-mean and no hint that another backend would take them."""

from __future__ import annotations

import dataclasses

import pytest

from relax.config import ConfigError, parse_config
from relax.config.help import GROUP_TITLES, group_flags
from relax.config.schema import GROUPS


def run_help(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(list(argv), validate=False)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_help_is_one_screen_of_titled_groups(capsys):
    code, out, _ = run_help(capsys, "--help")
    assert code == 0 and len(out.splitlines()) <= 50  # one screen
    assert all(f"  {name}" in out for name in GROUPS) and "--help-all" in out
    assert "Config(" not in out and "dataclass" not in out  # no generated signatures
    untitled = [name for name in GROUPS if name not in GROUP_TITLES]
    assert not untitled, f"give {untitled} a title and a few flags in relax/config/help.py GROUP_TITLES"


def test_help_group_lists_that_group_s_flags_one_line_each(capsys):
    code, out, _ = run_help(capsys, "--help", "optim")
    assert code == 0 and all(flag in out for flag in group_flags("optim"))
    assert "--rollout-batch-size" not in out
    assert len(out.splitlines()) <= len(group_flags("optim")) + 10


def test_help_all_lists_every_flag(capsys):
    code, out, _ = run_help(capsys, "--help-all")
    assert code == 0 and all(flag in out for name in GROUPS for flag in group_flags(name))


def test_an_unknown_group_gets_a_did_you_mean(capsys):
    code, _, err = run_help(capsys, "--help", "rolout")
    assert code == 2 and "no such flag group" in err and "did you mean rollout?" in err


@pytest.mark.parametrize("argv, expected", [
    (["--apply-chat-template"], True), (["--apply-chat-template", "true"], True),
    (["--apply-chat-template", "false"], False), (["--apply-chat-template", "True"], True),
    (["--polling-mode"], True), (["--progress-bar", "false"], False),  # flags that took a value only
    (["--offload-train", "false"], False), (["--no-offload-train"], False), (["--offload-train"], True),
])
def test_every_boolean_takes_the_seeds_spellings(argv, expected):
    cfg = parse_config(argv, validate=False)
    name = argv[0].removeprefix("--no-").removeprefix("--").replace("-", "_")
    values = {f.name: getattr(getattr(cfg, g), f.name) for g in GROUPS for f in dataclasses.fields(GROUPS[g])}
    assert values[name] is expected


def test_a_bad_boolean_value_is_named(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--colocate", "maybe"], validate=False)
    assert "expected true/false, got 'maybe'" in capsys.readouterr().err


def test_unknown_flags_get_a_did_you_mean_and_no_backend_hint(base):
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--rollout-max-respone-len", "8", "--colocte", "--totally-new-flag"])
    msg = str(err.value)
    assert "--rollout-max-respone-len (did you mean --rollout-max-response-len?)" in msg
    assert "--colocte (did you mean --colocate?)" in msg and "--totally-new-flag:" in msg
    assert "--train-backend megatron" not in msg and "if these are Megatron flags" not in msg


def test_an_unknown_flag_fails_before_other_checks(tmp_path):
    with pytest.raises(ConfigError, match="unknown flag"):
        parse_config(["--colocte"])  # no --hf-checkpoint either: the typo is reported first
