"""scripts/tools/process_avqa.py: AVQA-R1-6K JSON records -> Relax image + audio rows that load."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import wave

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


pa_ = _load("process_avqa")
MM_KEYS = {"image": "image_key", "audio": "audio_key"}


def avqa_record(i: int, **override) -> dict:
    """A record as EchoInk's make_omniInstruct_r1_dataset.py writes it."""
    record = {"problem_id": i, "problem": f"What makes the sound in clip {i}?", "data_type": "image_audio",
              "problem_type": "multiple choice", "options": ["A. a dog", "B. a car", "C. a bell", "D. rain"],
              "solution": "<answer>C</answer>",
              "path": {"image": f"images/sample_{i}.jpg", "audio": f"audios/sample_{i}.wav"},
              "data_source": "OmniInstruct_v1-AVQA"}
    record.update(override)
    return record


def make_split(tmp_path, records, *, media=True) -> str:
    """AVQA_R1/train/: the JSON list plus (optionally) real images/ and audios/ files."""
    split = tmp_path / "AVQA_R1" / "train"
    (split / "images").mkdir(parents=True)
    (split / "audios").mkdir()
    if media:
        from PIL import Image

        for record in records:
            Image.new("RGB", (8, 8), (0, 0, 255)).save(split / record["path"]["image"], format="JPEG")
            buffer = io.BytesIO()
            with wave.open(buffer, "wb") as wav:
                wav.setnchannels(1)
                wav.setsampwidth(2)
                wav.setframerate(16000)
                wav.writeframes(b"\x00\x00" * 160)
            (split / record["path"]["audio"]).write_bytes(buffer.getvalue())
    path = split / "omni_rl_format_train.json"
    path.write_text(json.dumps(records, indent=2))
    return str(path)


def test_convert_record_builds_placeholders_options_and_letter_label():
    out = pa_.convert_record(avqa_record(7), md_dir="/data/train")
    assert out["prompt"] == [{"role": "user", "content": "<image><audio>What makes the sound in clip 7?\nOptions:\n"
                                                         "A. a dog\nB. a car\nC. a bell\nD. rain"}]
    assert out["image_key"] == ["/data/train/images/sample_7.jpg"]
    assert out["audio_key"] == ["/data/train/audios/sample_7.wav"]
    assert out["label"] == "C"
    assert out["metadata"] == {"problem_id": 7, "problem_type": "multiple choice",
                               "data_source": "OmniInstruct_v1-AVQA"}


def test_without_md_dir_paths_stay_relative_and_absolute_paths_stay():
    assert pa_.convert_record(avqa_record(0))["image_key"] == ["images/sample_0.jpg"]
    record = avqa_record(0, path={"image": "/abs/i.jpg", "audio": "/abs/a.wav"})
    assert pa_.convert_record(record, md_dir="/data")["audio_key"] == ["/abs/a.wav"]


def test_unlettered_options_are_lettered_by_position_and_bare_letter_solutions_work():
    out = pa_.convert_record(avqa_record(0, options=["a dog", "a car"], solution="B"))
    assert out["prompt"][0]["content"].endswith("Options:\nA. a dog\nB. a car")
    assert out["label"] == "B"


def test_label_scores_with_the_multiple_choice_reward():
    from relax.engine.rewards import multiple_choice

    label = pa_.convert_record(avqa_record(0))["label"]
    assert multiple_choice.score("<think>ding</think><answer>C</answer>", label) == 1.0
    assert multiple_choice.score("<think>woof</think><answer>A</answer>", label) == 0.0


@pytest.mark.parametrize("override, needle", [
    ({"problem": ""}, "field 'problem' must be a non-empty string"),
    ({"options": []}, "field 'options' must be a non-empty list"),
    ({"options": ["A. x", "A. y"]}, "field 'options' repeats an option letter"),
    ({"solution": "<answer>E</answer>"}, "field 'solution' answers E, which is not one of the options"),
    ({"solution": "a bell"}, "field 'solution' must be one option letter"),
    ({"path": {"image": "images/x.jpg"}}, "field 'path.audio' must be a non-empty file path"),
    ({"path": None}, "field 'path.image' must be a non-empty file path"),
    ({"data_type": "video_audio"}, "field 'data_type' is 'video_audio'"),
])
def test_malformed_record_names_the_field(override, needle):
    with pytest.raises(pa_.BadRowError, match=needle):
        pa_.convert_record(avqa_record(0, **override))


def test_converted_jsonl_loads_through_relax_loader_with_media_checked(tmp_path, capsys):
    from relax.utils.data.dataset import PromptDataset

    src = make_split(tmp_path, [avqa_record(i) for i in range(3)])
    split_dir = os.path.dirname(src)
    out = os.path.join(split_dir, "omni_rl_format_train_relax.jsonl")
    assert pa_.main(["--input-dir", src, "--output-dir", out, "--md-dir", split_dir]) == 0
    assert "rows in=3 converted=3 skipped=0" in capsys.readouterr().out
    data = PromptDataset(out, input_key="prompt", label_key="label", multimodal_keys=MM_KEYS, check_media=True)
    assert len(data) == 3 and data.num_skipped == 0
    sample = data[2]
    assert sample.label == "C"
    assert sample.multimodal_inputs == {"image": [os.path.join(split_dir, "images/sample_2.jpg")],
                                        "audio": [os.path.join(split_dir, "audios/sample_2.wav")]}
    parts = sample.prompt[0]["content"]
    assert [p["type"] for p in parts] == ["image", "audio", "text"]
    assert parts[2]["text"].startswith("What makes the sound in clip 2?\nOptions:\nA. a dog")


def test_parquet_output_loads_too(tmp_path):
    from relax.utils.data.dataset import PromptDataset

    src = make_split(tmp_path, [avqa_record(0), avqa_record(1, problem_id="x1")])
    out = str(tmp_path / "avqa.parquet")
    pa_.convert(src, out, md_dir=os.path.dirname(src))
    assert [r["label"] for r in pq.read_table(out).to_pylist()] == ["C", "C"]
    data = PromptDataset(out, input_key="prompt", label_key="label", multimodal_keys=MM_KEYS, check_media=True)
    assert [s.metadata["problem_id"] for s in data] == [0, "x1"]


def test_missing_media_file_is_caught_by_the_loader_not_hidden(tmp_path):
    from relax.utils.data.dataset import PromptDataset
    from relax.utils.data.readers import DataError

    src = make_split(tmp_path, [avqa_record(0)], media=False)
    out = str(tmp_path / "avqa.jsonl")
    pa_.convert(src, out, md_dir=os.path.dirname(src))
    with pytest.raises(DataError, match="line 1"):
        PromptDataset(out, input_key="prompt", label_key="label", multimodal_keys=MM_KEYS, check_media=True)


def test_bad_record_stops_naming_file_record_and_field(tmp_path, capsys):
    src = make_split(tmp_path, [avqa_record(0), avqa_record(1, solution="<answer>Z</answer>")], media=False)
    out = tmp_path / "out.jsonl"
    assert pa_.main(["--input-dir", src, "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{src} (record 1): field 'solution' answers Z" in err and "--skip-bad-rows" in err
    assert not out.exists()


def test_skip_bad_rows_counts_and_keeps_the_rest(tmp_path, capsys):
    records = [avqa_record(0), "not an object", avqa_record(2, options=None), avqa_record(3)]
    src = make_split(tmp_path, [r for r in records if isinstance(r, dict) and r["options"]], media=False)
    with open(src, "w") as f:
        json.dump(records, f)
    out = str(tmp_path / "out.jsonl")
    assert pa_.main(["--input-dir", src, "--output-dir", out, "--skip-bad-rows"]) == 0
    printed = capsys.readouterr().out
    assert "rows in=4 converted=2 skipped=2" in printed
    assert "(record 1): expected a JSON object" in printed and "(record 2): field 'options'" in printed
    assert [json.loads(line)["metadata"]["problem_id"] for line in open(out)] == [0, 3]


def test_help_and_input_that_is_not_a_json_list(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        pa_.main(["--help"])
    assert exit_info.value.code == 0 and "--md-dir" in capsys.readouterr().out
    bad = tmp_path / "x.json"
    bad.write_text('{"problem": "?"}')
    assert pa_.main(["--input-dir", str(bad), "--output-dir", str(tmp_path / "o.jsonl")]) == 1
    assert "holds a JSON dict, expected a list of records" in capsys.readouterr().err
