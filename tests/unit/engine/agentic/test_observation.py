"""Observation ids from the chat template's own turn delimiters (Qwen2.5's tool template)."""

from __future__ import annotations

import pytest

from relax.engine.agentic.observation import ObservationEncoder, flatten_message

TOOL_TURN = "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer():
    from relax.utils.tiny_model import train_chatml_tokenizer

    return train_chatml_tokenizer(["price of plum tool response"] * 5, vocab_size=300, tool_template=True)


def test_after_a_turn_the_model_closed_the_observation_starts_with_the_templates_newline(tokenizer):
    encoder = ObservationEncoder(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert encoder.text("tool", "7", eos) == "\n" + TOOL_TURN  # the newline after <|im_end|> is kept
    ids, text, media = encoder.ids({"role": "tool", "content": "7"}, eos)
    assert ids == tokenizer.encode("\n" + TOOL_TURN, add_special_tokens=False) and media == {}


def test_a_turn_the_model_left_open_is_closed_by_the_observation(tokenizer):
    encoder = ObservationEncoder(tokenizer)
    last = tokenizer.convert_tokens_to_ids("</tool_call>")  # stopped on a stop string, no <|im_end|>
    assert encoder.text("tool", "7", last) == "<|im_end|>\n" + TOOL_TURN
    assert encoder.text("user", "go on", None) == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n" \
                                                   "<|im_start|>assistant\n"


def test_without_a_template_the_observation_is_its_text(tokenizer):
    from relax.backends.hf.tiny_model import build_tiny_tokenizer

    plain = build_tiny_tokenizer()
    plain.chat_template = None
    assert ObservationEncoder(plain).text("tool", "the cat sat", None) == "the cat sat"


def test_media_parts_become_placeholders_and_need_a_multimodal_model(tokenizer):
    message = {"role": "tool", "content": [{"type": "image", "image": "I"}, {"type": "text", "text": "zoomed"}]}
    assert flatten_message(message) == ("tool", "<image>zoomed", {"image": ["I"]})
    with pytest.raises(ValueError, match="takes text only"):
        ObservationEncoder(tokenizer).ids(message, None)
    with pytest.raises(ValueError, match="chat message"):
        flatten_message("just text")
