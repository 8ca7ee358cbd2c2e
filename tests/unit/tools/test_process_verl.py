"""scripts/tools/process_verl.py: verl parquet rows -> Relax rows (label flattening, metadata, images, bad rows)."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PNG = b"\x89PNG\r\n\x1a\nfake-image-bytes"


def _load_process_verl():
    if "process_verl" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "process_verl", os.path.join(REPO_ROOT, "scripts", "tools", "process_verl.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["process_verl"] = module
        spec.loader.exec_module(module)
    return sys.modules["process_verl"]


pv = _load_process_verl()


def verl_row(i: int, *, truth="72", images=None, extra=None) -> dict:
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"question {i}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": extra if extra is not None else {"split": "train", "index": i},
    }
    if images is not None:
        row["images"] = images
    return row


def write_verl(tmp_path, rows, name="train.parquet") -> str:
    path = str(tmp_path / name)
    pd.DataFrame(rows).to_parquet(path, index=False)  # pandas/pyarrow: nested dicts become structs
    return path


def test_convert_row_flattens_ground_truth_into_string_label():
    out = pv.convert_row(verl_row(0, truth="1,234"))
    assert out["label"] == "1,234"
    assert pv.convert_row(verl_row(0, truth=72))["label"] == "72"


def test_convert_row_keeps_chat_prompt_and_puts_data_source_in_extra_info():
    out = pv.convert_row(verl_row(3))
    assert out["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "question 3"}]
    assert out["extra_info"] == {"split": "train", "index": 3, "data_source": "openai/gsm8k", "ability": "math"}
    assert "image" not in out


def test_top_level_data_source_wins_over_extra_info_key():
    out = pv.convert_row(verl_row(0, extra={"data_source": "stale", "k": 1}))
    assert out["extra_info"]["data_source"] == "openai/gsm8k" and out["extra_info"]["k"] == 1


def test_image_dicts_become_bytes_and_relative_paths_join_md_dir():
    images = [{"bytes": PNG, "path": "ignored.png"}, {"bytes": None, "path": "imgs/a.png"}, "/abs/b.png"]
    row = verl_row(0, images=images)
    assert pv.convert_row(row, md_dir="/data/md")["image"] == [PNG, "/data/md/imgs/a.png", "/abs/b.png"]
    assert pv.convert_row(row)["image"][1] == "imgs/a.png"


def test_preprocessed_images_take_precedence_over_images():
    row = verl_row(0, images=["raw.png"])
    row["preprocessed_images"] = [{"bytes": PNG, "path": None}]
    assert pv.convert_row(row)["image"] == [PNG]


@pytest.mark.parametrize("reward_model, problem", [
    (None, "no ground truth"),
    ({"style": "rule"}, "no ground truth"),
    ({"style": "rule", "ground_truth": None}, "no ground truth"),
    ({"ground_truth": ["1", "2"]}, "must be a string or a number"),
    ({"ground_truth": True}, "must be a string or a number"),
])
def test_convert_row_rejects_missing_or_mistyped_ground_truth(reward_model, problem):
    row = verl_row(0)
    row["reward_model"] = reward_model
    with pytest.raises(pv.BadRowError, match=problem):
        pv.convert_row(row)


def test_convert_row_rejects_bad_prompt_and_extra_info():
    with pytest.raises(pv.BadRowError, match="'prompt'"):
        pv.convert_row({**verl_row(0), "prompt": []})
    with pytest.raises(pv.BadRowError, match="'extra_info' must be a dict"):
        pv.convert_row({**verl_row(0), "extra_info": [1, 2]})


def test_parquet_round_trip_keeps_label_metadata_and_image_bytes(tmp_path):
    src = write_verl(tmp_path, [verl_row(i, images=[{"bytes": PNG, "path": None}]) for i in range(3)])
    out = str(tmp_path / "relax" / "train.parquet")
    summary = pv.convert(src, out)
    assert (summary["rows_in"], summary["rows_out"], summary["skipped"]) == (3, 3, 0)
    rows = pq.read_table(out).to_pylist()
    assert [r["label"] for r in rows] == ["72"] * 3
    assert rows[2]["extra_info"] == {"split": "train", "index": 2, "data_source": "openai/gsm8k", "ability": "math"}
    assert rows[0]["image"] == [PNG]
    assert rows[0]["prompt"][1] == {"role": "user", "content": "question 0"}


def test_jsonl_output_writes_bytes_as_data_urls(tmp_path):
    src = write_verl(tmp_path, [verl_row(0, images=[{"bytes": PNG, "path": None}])])
    out = tmp_path / "train.jsonl"
    pv.convert(src, str(out))
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["label"] == "72" and row["extra_info"]["data_source"] == "openai/gsm8k"
    assert row["image"] == ["data:image/png;base64," + base64.b64encode(PNG).decode()]


def test_bad_row_error_names_file_and_row_index(tmp_path):
    rows = [verl_row(0), verl_row(1), verl_row(2)]
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": None}
    src = write_verl(tmp_path, rows)
    with pytest.raises(pv.BadRowError) as err:
        pv.convert(src, str(tmp_path / "out.parquet"))
    assert f"{src} (row 1): no ground truth" in str(err.value) and "--skip-bad-rows" in str(err.value)
    assert not (tmp_path / "out.parquet").exists()


def test_skip_bad_rows_counts_and_drops_them(tmp_path, capsys):
    rows = [verl_row(i) for i in range(4)]
    rows[0]["reward_model"] = {"style": "rule", "ground_truth": None}
    rows[3]["reward_model"] = {"style": "rule", "ground_truth": None}
    src = write_verl(tmp_path, rows)
    out = str(tmp_path / "out.jsonl")
    assert pv.main(["--input-dir", src, "--output-dir", out, "--skip-bad-rows"]) == 0
    assert "rows in=4 out=2 skipped=2" in capsys.readouterr().out
    kept = [json.loads(line)["extra_info"]["index"] for line in open(out)]
    assert kept == [1, 2]


def test_cli_reports_bad_row_and_exits_nonzero(tmp_path, capsys):
    rows = [verl_row(0)]
    rows[0]["reward_model"] = {"style": "rule", "ground_truth": None}
    src = write_verl(tmp_path, rows)
    assert pv.main(["--input-dir", src, "--output-dir", str(tmp_path / "o.parquet")]) == 1
    assert "(row 0): no ground truth" in capsys.readouterr().err


def test_directory_input_merges_files_in_sorted_order(tmp_path):
    (tmp_path / "verl").mkdir()
    write_verl(tmp_path / "verl", [verl_row(1)], name="b.parquet")
    write_verl(tmp_path / "verl", [verl_row(0)], name="a.parquet")
    out = str(tmp_path / "all.jsonl")
    assert pv.convert(str(tmp_path / "verl"), out)["rows_out"] == 2
    assert [json.loads(line)["prompt"][1]["content"] for line in open(out)] == ["question 0", "question 1"]


def test_output_directory_gets_one_parquet_per_input(tmp_path):
    (tmp_path / "verl").mkdir()
    write_verl(tmp_path / "verl", [verl_row(0)], name="train.parquet")
    write_verl(tmp_path / "verl", [verl_row(1)], name="test.parquet")
    summary = pv.convert(str(tmp_path / "verl"), str(tmp_path / "relax"))
    assert sorted(os.listdir(tmp_path / "relax")) == ["test.parquet", "train.parquet"]
    assert summary["rows_out"] == 2


def test_converted_rows_load_as_relax_samples(tmp_path):
    from relax.utils.data.formatting import PromptFormat, build_sample
    from relax.utils.data.readers import iter_records

    src = write_verl(tmp_path, [verl_row(5)])
    out = str(tmp_path / "train.parquet")
    pv.convert(src, out)
    fmt = PromptFormat(input_key="prompt", label_key="label", metadata_key="extra_info")
    ((location, row),) = list(iter_records(out))
    sample = build_sample(row, location, fmt, tokenizer=None)
    assert sample.label == "72" and sample.metadata["data_source"] == "openai/gsm8k"
    assert sample.prompt[1]["content"] == "question 5"
