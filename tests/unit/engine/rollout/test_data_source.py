"""RolloutDataSource(WithBuffer): groups, epochs, shuffling, buffer, and save/load resume equality."""

from __future__ import annotations

import json
import logging
from argparse import Namespace
from pathlib import Path

import pytest

from relax.config.schema import RelaxConfig
from relax.engine.rollout.data_source import (
    DataSource,
    RolloutDataSource,
    RolloutDataSourceWithBuffer,
    latest_saved_rollout_id,
    state_path,
)
from relax.types import Sample

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tokenizer_dir(path: Path) -> str:
    """A tiny word-level ChatML tokenizer saved where AutoTokenizer.from_pretrained can load it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(["question user assistant system be brief"],
                                trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>")
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(str(path))
    return str(path)


def write_prompts(path: Path, count: int) -> str:
    rows = [{"input": f"question {i}", "label": str(i), "metadata": {"id": i}} for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def make_args(tmp_path: Path, **overrides) -> Namespace:
    """The run's plugin args (every flag at its default) with these data settings."""
    args = dict(prompt_data=write_prompts(tmp_path / "prompts.jsonl", 5), label_key="label", rollout_batch_size=2,
                n_samples_per_prompt=2, save=str(tmp_path / "ckpt"), load=str(tmp_path / "ckpt"))
    return RelaxConfig().replace(**(args | overrides)).args


def labels(groups: list[list[Sample]]) -> list[str]:
    return [group[0].label for group in groups]


def as_dicts(groups: list[list[Sample]]) -> list[list[dict]]:
    return [[sample.to_dict() for sample in group] for group in groups]


def test_groups_hold_n_deep_copies_with_global_indices(tmp_path):
    source = RolloutDataSource(make_args(tmp_path, n_samples_per_prompt=3))
    groups = source.get_samples(2)
    assert [[s.group_index for s in g] for g in groups] == [[0, 0, 0], [1, 1, 1]]
    assert [[s.index for s in g] for g in groups] == [[0, 1, 2], [3, 4, 5]]
    assert [[s.prompt for s in g] for g in groups][1] == ["question 1"] * 3
    groups[0][0].metadata["touched"] = True
    assert "touched" not in groups[0][1].metadata
    assert "touched" not in source.dataset[0].metadata
    assert [s.group_index for s in source.get_samples(1)[0]] == [2, 2, 2]


def test_tool_key_picks_the_rows_tool_schemas_column(tmp_path):
    data = tmp_path / "tools.jsonl"
    row = {"input": "q", "label": "1", "tools": [{"name": "a"}], "funcs": [{"name": "calc"}]}
    data.write_text(json.dumps(row) + "\n")
    default = RolloutDataSource(make_args(tmp_path, prompt_data=str(data))).get_samples(1)[0][0]
    assert default.metadata["tools"] == [{"name": "a"}]  # --tool-key tools
    keyed = RolloutDataSource(make_args(tmp_path, prompt_data=str(data), tool_key="funcs")).get_samples(1)[0][0]
    assert keyed.metadata["tools"] == [{"name": "calc"}]


def test_len_is_the_number_of_prompts_and_the_class_meets_the_protocol(tmp_path):
    source = RolloutDataSourceWithBuffer(make_args(tmp_path))
    assert len(source) == 5
    assert isinstance(source, DataSource)


def test_get_samples_crosses_epochs_seamlessly(tmp_path):
    source = RolloutDataSource(make_args(tmp_path))
    assert labels(source.get_samples(3)) == ["0", "1", "2"]
    assert labels(source.get_samples(4)) == ["3", "4", "0", "1"]
    assert source.epoch == 1
    assert labels(source.get_samples(9)) == ["2", "3", "4", "0", "1", "2", "3", "4", "0"]


def test_shuffle_is_seeded_per_epoch(tmp_path):
    args = make_args(tmp_path, prompt_data=write_prompts(tmp_path / "many.jsonl", 12), rollout_shuffle=True)
    first = labels(RolloutDataSource(args).get_samples(24))
    assert first == labels(RolloutDataSource(args).get_samples(24))
    epoch0, epoch1 = first[:12], first[12:]
    assert sorted(epoch0, key=int) == sorted(epoch1, key=int) == [str(i) for i in range(12)]
    assert epoch0 != epoch1 and epoch0 != [str(i) for i in range(12)]
    other_seed = labels(RolloutDataSource(make_args(tmp_path, prompt_data=args.prompt_data, rollout_shuffle=True,
                                                    rollout_seed=7)).get_samples(12))
    assert other_seed != epoch0


def test_buffer_is_served_first_then_the_dataset_tops_up(tmp_path):
    source = RolloutDataSourceWithBuffer(make_args(tmp_path))
    first = source.get_samples(2)
    source.add_samples([first[1]])
    groups = source.get_samples(3)
    assert labels(groups) == ["1", "2", "3"]
    assert groups[0] is first[1]
    assert source.get_buffer_length() == 0


def test_add_samples_refuses_partial_groups(tmp_path):
    source = RolloutDataSourceWithBuffer(make_args(tmp_path))
    group = source.get_samples(1)[0]
    with pytest.raises(ValueError, match="--n-samples-per-prompt"):
        source.add_samples([group[:1]])


def test_read_only_source_refuses_add_samples(tmp_path):
    source = RolloutDataSource(make_args(tmp_path))
    with pytest.raises(RuntimeError, match="RolloutDataSourceWithBuffer"):
        source.add_samples(source.get_samples(1))


def pick_last_without_removing(args, rollout_id, buffer, num_samples):
    """A buffer filter that only selects (newest first); the data source removes what it returns."""
    return list(reversed(buffer))[:num_samples]


def test_custom_buffer_filter_selects_and_selected_groups_leave_the_buffer(tmp_path):
    args = make_args(tmp_path, buffer_filter_path=f"{__name__}.pick_last_without_removing")
    source = RolloutDataSourceWithBuffer(args)
    source.add_samples(source.get_samples(3))
    assert labels(source.get_samples(2)) == ["2", "1"]
    assert labels(source.buffer) == ["0"]


def test_buffer_filter_with_wrong_signature_names_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--buffer-filter-path"):
        RolloutDataSourceWithBuffer(make_args(tmp_path, buffer_filter_path=f"{__name__}.labels"))


def test_resume_from_save_reproduces_the_following_groups_and_buffer(tmp_path):
    args = make_args(tmp_path, prompt_data=write_prompts(tmp_path / "many.jsonl", 7), rollout_shuffle=True)
    original = RolloutDataSourceWithBuffer(args)
    original.get_samples(5)
    handed_back = original.get_samples(3)
    handed_back[0][0].reward = 1.0
    handed_back[0][0].status = Sample.Status.ABORTED
    original.add_samples(handed_back[:2])
    original.save(4)
    assert Path(state_path(args.save, 4)).is_file()

    resumed = RolloutDataSourceWithBuffer(args)
    resumed.load(4)
    assert as_dicts(resumed.buffer) == as_dicts(original.buffer)
    for count in (3, 6, 9):  # crosses into later epochs
        assert as_dicts(resumed.get_samples(count)) == as_dicts(original.get_samples(count))


def test_load_without_rollout_id_takes_the_latest_state(tmp_path):
    args = make_args(tmp_path)
    source = RolloutDataSource(args)
    source.get_samples(1)
    source.save(1)
    source.get_samples(2)
    source.save(3)
    assert latest_saved_rollout_id(args.load) == 3
    resumed = RolloutDataSource(args)
    resumed.load()
    assert resumed.sample_group_index == 3
    assert labels(resumed.get_samples(1)) == labels(source.get_samples(1)) == ["3"]


def test_load_with_no_saved_state_starts_fresh_and_says_so(tmp_path, caplog):
    source = RolloutDataSourceWithBuffer(make_args(tmp_path))
    with caplog.at_level(logging.INFO, logger="relax.engine.rollout.data_source"):
        source.load()  # the latest, and there is none: a fresh start
    assert "starting from the first prompt" in caplog.text
    assert labels(source.get_samples(1)) == ["0"]


def test_a_requested_position_that_was_never_saved_is_an_error_not_a_silent_restart(tmp_path):
    source = RolloutDataSourceWithBuffer(make_args(tmp_path))
    with pytest.raises(FileNotFoundError,
                       match=r"no saved data position for step 7 \(.*global_dataset_state_dict_7.pt\)"):
        source.load(7)


def test_streaming_source_resumes_exactly(tmp_path):
    args = make_args(tmp_path, prompt_data=write_prompts(tmp_path / "many.jsonl", 9), rollout_shuffle=True,
                     use_streaming_dataset=True, streaming_buffer_size=4)
    original = RolloutDataSourceWithBuffer(args)
    assert len(original) == 9
    original.get_samples(11)
    original.save(2)
    resumed = RolloutDataSourceWithBuffer(args)
    resumed.load(2)
    assert as_dicts(resumed.get_samples(10)) == as_dicts(original.get_samples(10))


def test_verl_style_prompt_data_string_and_chat_template_from_hf_checkpoint(tmp_path):
    a = write_prompts(tmp_path / "a.jsonl", 2)
    b = write_prompts(tmp_path / "b.jsonl", 1)
    args = make_args(tmp_path, prompt_data=f"['{a}', '{b}']", apply_chat_template=True, system_prompt="be brief",
                     hf_checkpoint=make_tokenizer_dir(tmp_path / "tok"))
    source = RolloutDataSource(args)
    assert len(source) == 3
    prompt = source.get_samples(1)[0][0].prompt
    assert prompt == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nquestion 0<|im_end|>\n"
                      "<|im_start|>assistant\n")


def shout(prompt, data):
    return prompt.upper() + f" #{data['label']}"


def test_custom_prompt_path_is_loaded_and_applied(tmp_path):
    source = RolloutDataSource(make_args(tmp_path, custom_prompt_path=f"{__name__}.shout"))
    assert source.get_samples(1)[0][0].prompt == "QUESTION 0 #0"


def test_json_string_flags_are_parsed(tmp_path):
    from PIL import Image

    image = str(tmp_path / "x.png")
    Image.new("RGB", (2, 2)).save(image)  # the in-memory dataset checks media files exist and decode
    rows = [{"input": "<image>question", "label": "1", "imgs": [image]}]
    (tmp_path / "mm.jsonl").write_text(json.dumps(rows[0]) + "\n")
    source = RolloutDataSource(make_args(tmp_path, prompt_data=str(tmp_path / "mm.jsonl"),
                                         multimodal_keys='{"image": "imgs"}'))
    assert source.get_samples(1)[0][0].multimodal_inputs == {"image": [image]}


def test_without_prompt_data_groups_are_empty_placeholders(tmp_path):
    source = RolloutDataSource(make_args(tmp_path, prompt_data=None))
    groups = source.get_samples(2)
    assert len(source) == 0
    assert [[s.index for s in g] for g in groups] == [[0, 1], [2, 3]]
    assert groups[0][0].prompt == ""
