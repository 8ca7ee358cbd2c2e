"""scripts/tools/process_openr1.py: OpenR1-multimodal parquet rows -> Relax rows that load with images."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _load(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, "scripts", "tools", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


po = _load("process_openr1")


def png_bytes(colour=(255, 0, 0)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, format="PNG")
    return out.getvalue()


PNG = png_bytes()


def openr1_row(i: int, *, image=None, problem=None, solution=None) -> dict:
    """A row in the published layout: image struct, problem, solution, original_question/answer."""
    return {"image": image if image is not None else {"bytes": PNG, "path": f"{i}.png"},
            "problem": problem if problem is not None else f"What is the area of triangle {i}?",
            "solution": solution if solution is not None else f"<answer> {i + 2} </answer>",
            "original_question": f"Find the area {i}.", "original_answer": f"Answer: {i + 2}"}


IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # HF datasets' Image feature
SCHEMA = pa.schema([("image", IMAGE_TYPE), ("problem", pa.string()), ("solution", pa.string()),
                    ("original_question", pa.string()), ("original_answer", pa.string())])


def write_openr1(tmp_path, rows, name="train-00000-of-00001.parquet") -> str:
    path = str(tmp_path / name)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


def test_convert_row_puts_image_placeholder_bytes_and_solution_label():
    out = po.convert_row(openr1_row(3))
    assert out["prompt"] == [{"role": "user", "content": "<image>What is the area of triangle 3?"}]
    assert out["image"] == [PNG] and out["label"] == "<answer> 5 </answer>"
    assert out["metadata"] == {"original_question": "Find the area 3.", "original_answer": "Answer: 5"}


def test_problem_that_already_has_its_placeholder_gets_no_second_one():
    out = po.convert_row(openr1_row(0, problem="Look: <image> How many sides?"))
    assert out["prompt"][0]["content"] == "Look: <image> How many sides?"
    with pytest.raises(po.BadRowError, match="'problem' holds 2 <image> placeholders"):
        po.convert_row(openr1_row(0, problem="<image><image> Compare."))


def test_image_path_without_bytes_joins_md_dir():
    row = openr1_row(0, image={"bytes": None, "path": "imgs/0.png"})
    assert po.convert_row(row, md_dir="/data")["image"] == ["/data/imgs/0.png"]
    assert po.convert_row(row)["image"] == ["imgs/0.png"]


@pytest.mark.parametrize("field, value, needle", [
    ("problem", "  ", "field 'problem' must be a non-empty string"),
    ("problem", None, "field 'problem' must be a non-empty string"),
    ("solution", None, "field 'solution' must be a non-empty string"),
    ("solution", 5, "field 'solution' must be a non-empty string"),
    ("image", {"bytes": None, "path": None}, "field 'image' must be image bytes"),
])
def test_malformed_row_names_the_field(field, value, needle):
    row = openr1_row(0)
    row[field] = value
    with pytest.raises(po.BadRowError, match=needle):
        po.convert_row(row)


def test_parquet_file_converts_and_loads_through_relax_loader_with_the_image_checked(tmp_path):
    from relax.utils.data.dataset import PromptDataset

    src = write_openr1(tmp_path, [openr1_row(i) for i in range(3)])
    out = str(tmp_path / "relax" / "train.parquet")
    summary = po.convert(src, out)
    assert (summary["rows_in"], summary["rows_out"], summary["skipped"]) == (3, 3, 0)
    data = PromptDataset(out, input_key="prompt", label_key="label", multimodal_keys={"image": "image"},
                         check_media=True)
    assert len(data) == 3 and data.num_skipped == 0
    sample = data[1]
    assert sample.label == "<answer> 3 </answer>"
    assert sample.multimodal_inputs == {"image": [PNG]}
    assert sample.prompt[0]["content"] == [{"type": "image", "image": PNG},
                                           {"type": "text", "text": "What is the area of triangle 1?"}]
    assert sample.metadata == {"original_question": "Find the area 1.", "original_answer": "Answer: 3"}


def test_label_scores_with_the_openr1mm_reward(tmp_path):
    from relax.engine.rewards import openr1mm

    label = po.convert_row(openr1_row(0))["label"]
    assert openr1mm.score("<think>base times height</think><answer>2</answer>", label) == 1.0
    assert openr1mm.score("<think>hm</think><answer>3</answer>", label) == 0.0


def test_jsonl_output_writes_image_bytes_as_data_urls_that_load(tmp_path):
    from relax.utils.data.dataset import PromptDataset

    src = write_openr1(tmp_path, [openr1_row(0)])
    out = tmp_path / "train.jsonl"
    po.convert(src, str(out))
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["image"] == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
    data = PromptDataset(str(out), input_key="prompt", label_key="label", multimodal_keys={"image": "image"},
                         check_media=True)
    assert len(data) == 1 and data[0].label == "<answer> 2 </answer>"


def test_bad_row_stops_with_file_row_and_field_and_writes_nothing(tmp_path, capsys):
    rows = [openr1_row(0), openr1_row(1, solution=""), openr1_row(2)]
    src = write_openr1(tmp_path, rows)
    out = tmp_path / "out.parquet"
    assert po.main(["--input-dir", src, "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{src} (row 1): field 'solution' must be a non-empty string" in err and "--skip-bad-rows" in err
    assert not out.exists()


def test_skip_bad_rows_prints_a_summary_and_keeps_the_rest(tmp_path, capsys):
    rows = [openr1_row(0), openr1_row(1, image={"bytes": None, "path": None}), openr1_row(2)]
    src = write_openr1(tmp_path, rows)
    out = str(tmp_path / "out.parquet")
    assert po.main(["--input-dir", src, "--output-dir", out, "--skip-bad-rows"]) == 0
    printed = capsys.readouterr().out
    assert "rows in=3 converted=2 skipped=1" in printed and "(row 1): field 'image'" in printed
    assert [r["label"] for r in pq.read_table(out).to_pylist()] == ["<answer> 2 </answer>", "<answer> 4 </answer>"]


def test_help_and_wrong_output_extension(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        po.main(["--help"])
    assert exit_info.value.code == 0 and "--md-dir" in capsys.readouterr().out
    src = write_openr1(tmp_path, [openr1_row(0)])
    assert po.main(["--input-dir", src, "--output-dir", str(tmp_path / "out.csv")]) == 1
    assert "must end with one of .parquet, .jsonl" in capsys.readouterr().err
