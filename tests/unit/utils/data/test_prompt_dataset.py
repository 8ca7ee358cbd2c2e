"""PromptDataset: rows -> prompt Samples (templating, system prompt, filters, malformed rows)."""

from __future__ import annotations

import logging

import pytest
from prompt_data_helpers import numbered_rows, write_jsonl, write_parquet

from relax.utils.data import DataError, PromptDataset

USER_MSG = [{"role": "user", "content": "what is one plus one"}]


def test_jsonl_string_prompts_keep_label_and_metadata(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(3))
    dataset = PromptDataset(str(path), label_key="label")
    assert len(dataset) == 3
    assert [s.prompt for s in dataset] == ["question 0", "question 1", "question 2"]
    assert [s.label for s in dataset] == ["0", "1", "2"]
    assert dataset[1].metadata == {"id": 1}


def test_parquet_message_prompts_stay_messages_without_chat_template(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [{"prompt": USER_MSG, "label": "2"}])
    dataset = PromptDataset(str(path), input_key="prompt", label_key="label")
    assert dataset[0].prompt == USER_MSG
    assert dataset[0].label == "2"
    assert dataset[0].metadata == {}


def test_chat_template_renders_messages_with_generation_prompt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": USER_MSG}])
    dataset = PromptDataset(str(path), tokenizer, input_key="prompt", apply_chat_template=True)
    assert dataset[0].prompt == "<|im_start|>user\nwhat is one plus one<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_wraps_a_string_prompt_as_a_user_message(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "what is two"}])
    dataset = PromptDataset(str(path), tokenizer, apply_chat_template=True)
    assert dataset[0].prompt == "<|im_start|>user\nwhat is two<|im_end|>\n<|im_start|>assistant\n"


def test_system_prompt_is_the_first_message_of_a_templated_prompt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": USER_MSG}])
    dataset = PromptDataset(str(path), tokenizer, input_key="prompt", apply_chat_template=True,
                            system_prompt="be brief")
    assert dataset[0].prompt.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n")


def test_system_prompt_is_prepended_to_an_untemplated_string_prompt(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "what is two"}])
    assert PromptDataset(str(path), system_prompt="be brief. ")[0].prompt == "be brief. what is two"


def test_system_prompt_heads_an_untemplated_message_list(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": USER_MSG}])
    prompt = PromptDataset(str(path), input_key="prompt", system_prompt="be brief")[0].prompt
    assert prompt == [{"role": "system", "content": "be brief"}, *USER_MSG]


def test_tools_reach_the_chat_template_and_metadata(tmp_path, tokenizer):
    tools = [{"type": "function", "function": {"name": "add"}}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": USER_MSG, "tools": tools},
                                             {"prompt": USER_MSG, "tools": '[{"name": "sub"}]'}])
    dataset = PromptDataset(str(path), tokenizer, input_key="prompt", apply_chat_template=True)
    assert '"name": "add"' in dataset[0].prompt
    assert dataset[0].metadata["tools"] == tools
    assert dataset[1].metadata["tools"] == [{"name": "sub"}]


def test_apply_chat_template_kwargs_reach_the_template(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": USER_MSG}])
    dataset = PromptDataset(str(path), tokenizer, input_key="prompt", apply_chat_template=True,
                            apply_chat_template_kwargs={"enable_thinking": False})
    assert dataset[0].prompt.endswith("<|im_start|>assistant\n<think></think>\n")


def test_metadata_json_string_is_parsed(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "q", "extra_info": '{"source": "gsm8k"}'}])
    assert PromptDataset(str(path), metadata_key="extra_info")[0].metadata == {"source": "gsm8k"}


def test_max_prompt_len_drops_long_prompts_and_counts_them(tmp_path, tokenizer, caplog):
    rows = [{"input": "one two"}, {"input": "one two three plus one"}, {"input": "one"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with caplog.at_level(logging.INFO, logger="relax.utils.data.dataset"):
        dataset = PromptDataset(str(path), tokenizer, max_prompt_len=2)
    assert [s.prompt for s in dataset] == ["one two", "one"]
    assert dataset.num_too_long == 1
    assert "dropped 1 prompt(s) longer than --rollout-max-prompt-len=2" in caplog.text


def test_max_prompt_len_measures_the_templated_prompt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "one"}])
    # "<|im_start|> user one <|im_end|> <|im_start|> assistant" is 6 tokens.
    assert len(PromptDataset(str(path), tokenizer, apply_chat_template=True, max_prompt_len=6)) == 1
    assert len(PromptDataset(str(path), tokenizer, apply_chat_template=True, max_prompt_len=5)) == 0


def test_multimodal_columns_become_multimodal_inputs_and_typed_parts(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "<image>what is the <image>"}], "imgs": ["a.png", "b.png"]}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    sample = PromptDataset(str(path), input_key="prompt", multimodal_keys={"image": "imgs"})[0]
    assert sample.multimodal_inputs == {"image": ["a.png", "b.png"]}
    assert sample.prompt[0]["content"] == [
        {"type": "image", "image": "a.png"},
        {"type": "text", "text": "what is the "},
        {"type": "image", "image": "b.png"},
    ]


def test_multimodal_item_without_placeholder_is_malformed(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "no placeholder", "imgs": ["a.png"]}])
    with pytest.raises(DataError, match=r"line 1\).*no placeholder"):
        PromptDataset(str(path), multimodal_keys={"image": "imgs"})


def test_custom_prompt_fn_runs_before_templating(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "two", "n": "one"}])
    dataset = PromptDataset(str(path), tokenizer, apply_chat_template=True,
                            custom_prompt_fn=lambda prompt, data: f"what is {data['n']} plus {prompt}")
    assert "user\nwhat is one plus two<|im_end|>" in dataset[0].prompt


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"question": "q", "label": "1"}, "no input key 'input'"),
        ({"input": 7, "label": "1"}, "must be a string or a non-empty list"),
        ({"input": [{"content": "no role"}], "label": "1"}, "must be a string or a non-empty list"),
        ({"input": "q"}, "label key 'label' is missing"),
        ({"input": "q", "label": "1", "metadata": [1, 2]}, "metadata 'metadata' must be a dict"),
        ({"input": "q", "label": "1", "tools": "{oops"}, "not valid JSON"),
    ],
)
def test_malformed_row_error_names_file_line_and_problem(tmp_path, row, reason):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"input": "fine", "label": "0"}, row])
    with pytest.raises(DataError) as info:
        PromptDataset(str(path), label_key="label")
    message = str(info.value)
    assert "rows.jsonl (line 2)" in message
    assert reason in message
    assert "--skip-malformed-rows" in message


def test_malformed_parquet_row_error_names_the_row_index(tmp_path):
    path = write_parquet(tmp_path / "rows.parquet", [{"input": "a", "label": "1"}, {"input": "b", "label": None}])
    with pytest.raises(DataError, match=r"rows\.parquet \(row index 1\): label key 'label'"):
        PromptDataset(str(path), label_key="label")


def test_skip_malformed_counts_and_logs_skipped_rows_once(tmp_path, caplog):
    rows = [{"input": "a"}, "{broken", {"other": 1}, {"input": "b"}, {"input": 3}]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="relax.utils.data.dataset"):
        dataset = PromptDataset(str(path), skip_malformed=True)
    assert [s.prompt for s in dataset] == ["a", "b"]
    assert dataset.num_skipped == 3
    warnings = [r for r in caplog.records if "skipped 3 malformed row(s)" in r.getMessage()]
    assert len(warnings) == 1
    assert "line 2" in warnings[0].getMessage() and "line 5" in warnings[0].getMessage()


def test_several_files_load_in_order_from_a_verl_style_list(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"input": "a0"}, {"input": "a1"}])
    b = write_parquet(tmp_path / "b.parquet", [{"input": "b0"}])
    dataset = PromptDataset(f"['{a}', '{b}']")
    assert [s.prompt for s in dataset] == ["a0", "a1", "b0"]


def test_chat_template_without_tokenizer_asks_for_hf_checkpoint(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "q"}])
    with pytest.raises(ValueError, match="--hf-checkpoint"):
        PromptDataset(str(path), apply_chat_template=True)


def test_structured_multimodal_parts_count_as_placed_items(tmp_path):
    content = [{"type": "image", "image": "a.png"}, {"type": "text", "text": "what is this"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": [{"role": "user", "content": content}], "imgs": ["a.png"]}])
    sample = PromptDataset(str(path), input_key="prompt", multimodal_keys={"image": "imgs"})[0]
    assert sample.prompt[0]["content"] == content
    assert sample.multimodal_inputs == {"image": ["a.png"]}


def test_a_multimodal_row_with_a_system_message_renders_through_a_string_template(tmp_path, tokenizer):
    """The placeholder split turns every message into typed parts, the system message too; templates
    that concatenate strings (Qwen2.5's) get them back as strings, media parts as placeholders."""
    import copy

    strict = copy.deepcopy(tokenizer)
    strict.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                            "'<|im_end|>\\n' }}{% endfor %}{{ '<|im_start|>assistant\\n' }}")
    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "<image>what is"}],
             "imgs": ["a.png"]}]
    sample = PromptDataset(str(write_jsonl(tmp_path / "d.jsonl", rows)), strict, input_key="prompt",
                           multimodal_keys={"image": "imgs"}, apply_chat_template=True)[0]
    assert sample.prompt == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n<image>what is<|im_end|>\n"
                             "<|im_start|>assistant\n")
