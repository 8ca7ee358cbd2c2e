"""Inputs checked before Ray starts (relax.config.preflight and the numeric ranges): each bad
input fails with the file, line, column or key and the fix, within the entrypoint's first second."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import pytest

from relax.config import ConfigError, parse_config
from relax.config import preflight
from relax.entrypoints.train import main
from relax.utils import checkpoints


@pytest.fixture()
def base(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "head_dim": 16}))
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2"}\n{"prompt": "2+2", "label": "4"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--input-key", "prompt",
            "--label-key", "label", "--rollout-batch-size", "2", "--num-rollout", "1",
            "--rollout-max-response-len", "8", "--exp-dir", str(tmp_path / "exp")]


def with_data(base, tmp_path, text: str) -> list[str]:
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    args = list(base)
    args[args.index("--prompt-data") + 1] = str(path)
    return args


def check(args):
    preflight.check_inputs(parse_config(args))


def test_good_inputs_pass(base):
    check(base)


def test_bad_rows_are_listed_with_line_column_and_fix(base, tmp_path):
    args = with_data(base, tmp_path, '{"prompt": "a", "label": 1}\n{"prompt": "b", "label": 1\n'
                                     '{"prompt": "c"}\n\n[1, 2]\n{"question": "d", "label": 2}\n')
    with pytest.raises(ConfigError) as err:
        check(args)
    text = str(err.value)
    assert "4 of 5 rows checked are malformed" in text
    assert "rows.jsonl (line 2): invalid JSON (Expecting ',' delimiter at column 27)" in text
    assert "(line 3): label key 'label' is missing" in text
    assert "(line 5): expected a JSON object per line, got list" in text
    assert "(line 6): no input key 'prompt'" in text
    assert "--skip-malformed-rows" in text


def test_skip_malformed_rows_warns_instead(base, tmp_path, caplog):
    check(with_data(base, tmp_path, '{"prompt": "a", "label": 1}\n{"prompt": "b"\n') + ["--skip-malformed-rows"])
    assert "1 of 2 rows checked are malformed and will be skipped" in caplog.text


def test_no_usable_row_fails_even_with_skip(base, tmp_path):
    with pytest.raises(ConfigError, match="no row is usable: check --input-key"):
        check(with_data(base, tmp_path, '{"q": "a"}\n') + ["--skip-malformed-rows"])


@pytest.mark.parametrize("text, needle", [("", "the file is empty"), ("\n\n", "no rows")])
def test_empty_data_fails(base, tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        check(with_data(base, tmp_path, text))


def test_rows_past_the_budget_are_left_to_the_stream(base, tmp_path):
    from relax.utils.data.formatting import PromptFormat

    path = tmp_path / "big.jsonl"
    path.write_text('{"prompt": "a"}\n' * 50 + "{broken\n")
    assert preflight.check_rows(str(path), PromptFormat(input_key="prompt"), "--prompt-data", limit_bytes=200) < 50


def test_an_unwritable_save_dir_fails(base, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"--save .*file/ckpt: cannot write there"):
        check(base + ["--save", str(blocker / "ckpt")])


def test_a_save_dir_without_room_for_a_checkpoint_fails(base, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 5000, 5000))
    with pytest.raises(ConfigError, match=r"one checkpoint needs about .* GiB and only .* GiB is free"):
        check(base + ["--save", str(tmp_path / "ckpt")])
    check(base + ["--save", str(tmp_path / "ckpt"), "--no-save-optim"])  # 4 KiB of weights fit


def test_an_incomplete_checkpoint_is_refused_before_ray(base, tmp_path):
    load = tmp_path / "ckpt"
    (load / "iter_0000002").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no latest_checkpointed_iteration.txt"):
        check(base + ["--load", str(load)])
    (load / checkpoints.POINTER).write_text("2")
    with pytest.raises(ConfigError, match="step 2.*incomplete, missing: .*checkpoint.json"):
        check(base + ["--load", str(load)])


@pytest.mark.parametrize("flag, value, needle", [
    ("--lr", "-1", "--lr must be > 0 (a learning rate), got -1.0"),
    ("--eps-clip", "0", "--eps-clip must be > 0"),
    ("--rollout-top-p", "1.5", "--rollout-top-p must be > 0 and <= 1"),
    ("--gamma", "-0.1", "--gamma must be >= 0 and <= 1"),
    ("--clip-grad", "-1", "--clip-grad must be >= 0"),
    ("--global-batch-size", "0", "--global-batch-size must be >= 1"),
    ("--adam-beta2", "1", "--adam-beta2 must be >= 0 and < 1"),
])
def test_numeric_ranges(base, flag, value, needle):
    with pytest.raises(ConfigError) as err:
        parse_config(base + [flag, value])
    assert needle in str(err.value)


def test_the_entrypoint_reports_input_errors_with_status_2(base, tmp_path, capsys):
    assert main(with_data(base, tmp_path, '{"prompt": "b", "label": 1\n') + ["--dry-run"]) == 2
    assert "relax-train: error: --prompt-data" in capsys.readouterr().err


def test_checking_creates_nothing(base, tmp_path):
    """--dry-run and the checks leave no directory behind: --save and --exp-dir are created when the
    run starts, and only their nearest existing parent is checked here."""
    save = tmp_path / "not" / "yet" / "ckpt"
    check(base + ["--save", str(save)])
    assert not (tmp_path / "not").exists() and not (tmp_path / "exp").exists()
