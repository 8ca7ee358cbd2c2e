"""`--rollout-max-prompt-len` on multimodal rows: media count as the tokens the model sees.

An `<image>` placeholder is a few characters of text but expands to `<|vision_start|>`, one
`<|image_pad|>` per merged patch and `<|vision_end|>`. These tests build a tiny Qwen2.5-VL
checkpoint (real tokenizer, config and image processor; no mocks), write a row whose short text
carries a large image and one whose image is small, and check that the filter counts exactly
`len(processor.encode(text, media).input_ids)`, in memory and streaming, that media which cannot
be processed make a malformed row, and that a text-only run filters as before.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prompt_data_helpers import write_jsonl

from relax.utils.data import DataError, PromptDataset
from relax.utils.data.formatting import MediaLength

BIG, SMALL = 448, 56  # pixels per side: 64 image pads (the tiny processor's cap) vs 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer(["what is in the picture? a red square"] * 10, vocab_size=300)
    return build_tiny_vl("qwen2_5_vl", tokenizer, str(tmp_path_factory.mktemp("tiny_vl")))


def run_args(model_dir: str, **flags):
    """The run's flags (every other flag at its default) for a multimodal run of the tiny checkpoint."""
    from relax.config.schema import RelaxConfig

    return RelaxConfig().replace(hf_checkpoint=model_dir, label_key="label", multimodal_keys={"image": "img"},
                                 **flags).args


@pytest.fixture(scope="module")
def media_length(model_dir) -> MediaLength:
    from transformers import AutoTokenizer

    return MediaLength.for_model(model_dir, AutoTokenizer.from_pretrained(model_dir), run_args(model_dir))


def png(path: Path, side: int) -> str:
    from PIL import Image

    Image.new("RGB", (side, side), (200, 30, 30)).save(path)
    return str(path)


def mm_rows(tmp_path: Path, *, missing: bool = False) -> Path:
    """Row 0: short text, big image; row 1: the same text, small image; (row 2: a missing image)."""
    rows = [{"input": "<image> what is in the picture?", "label": "big", "img": [png(tmp_path / "big.png", BIG)]},
            {"input": "<image> what is in the picture?", "label": "small",
             "img": [png(tmp_path / "small.png", SMALL)]}]
    if missing:
        rows.append({"input": "<image> what?", "label": "gone", "img": [str(tmp_path / "gone.png")]})
    return write_jsonl(tmp_path / "mm.jsonl", rows)


def templated(media_length: MediaLength) -> str:
    return media_length.processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": "<image> what is in the picture?"}], tokenize=False, add_generation_prompt=True)


def encoded_length(media_length: MediaLength, image: str) -> int:
    """What the rollout sends for a row: the chat-templated prompt, its image expanded."""
    from relax.utils.multimodal.items import through_pipelines

    media = through_pipelines({"image": [image]}, media_length.pipelines)
    return len(media_length.processor.encode(templated(media_length), media).input_ids)


def text_length(media_length: MediaLength) -> int:
    """The same prompt counted as text (the placeholder as its characters' tokens)."""
    return len(media_length.processor.tokenizer.encode(templated(media_length), add_special_tokens=False))


def dataset(path: Path, media_length: MediaLength, max_prompt_len: int, **kwargs) -> PromptDataset:
    return PromptDataset(str(path), media_length.processor.tokenizer, label_key="label",
                         multimodal_keys={"image": "img"}, max_prompt_len=max_prompt_len,
                         media_length=media_length, **kwargs)


def test_the_filter_counts_exactly_the_encoded_ids(tmp_path, media_length):
    path = mm_rows(tmp_path)
    big = encoded_length(media_length, str(tmp_path / "big.png"))
    small = encoded_length(media_length, str(tmp_path / "small.png"))
    assert small < text_length(media_length) < big  # the placeholder text alone would keep the big row
    for limit, kept in ((big, ["big", "small"]), (big - 1, ["small"]), (small, ["small"]), (small - 1, [])):
        data = dataset(path, media_length, limit)
        assert [s.label for s in data] == kept, limit
        assert data.num_too_long == 2 - len(kept) and data.num_skipped == 0


@pytest.mark.parametrize("apply_chat_template", [False, True])
def test_a_short_text_with_a_big_image_is_dropped_and_logged(tmp_path, media_length, caplog, apply_chat_template):
    path = mm_rows(tmp_path)
    limit = encoded_length(media_length, str(tmp_path / "big.png")) - 1
    with caplog.at_level(logging.INFO, logger="relax.utils.data.dataset"):
        data = dataset(path, media_length, limit, apply_chat_template=apply_chat_template)
    assert [s.label for s in data] == ["small"] and data.num_too_long == 1
    assert "dropped 1 prompt(s) longer than --rollout-max-prompt-len" in caplog.text
    assert "media counted as the model's media tokens" in caplog.text


def test_media_that_cannot_be_processed_make_a_malformed_row(tmp_path, media_length):
    path = mm_rows(tmp_path, missing=True)
    with pytest.raises(DataError, match=r"mm.jsonl \(line 3\).*--rollout-max-prompt-len.*gone.png.*"
                                        r"--skip-malformed-rows"):
        dataset(path, media_length, 1000)
    data = dataset(path, media_length, 1000, skip_malformed=True)
    assert [s.label for s in data] == ["big", "small"] and data.num_skipped == 1
    assert "gone.png" in data.skip_reasons[0] and "line 3" in data.skip_reasons[0]


@pytest.mark.parametrize("streaming", [False, True])
def test_the_data_source_counts_media_in_memory_and_streaming(tmp_path, model_dir, media_length, streaming):
    from relax.engine.rollout.data_source import build_prompt_dataset, load_tokenizer
    from relax.engine.specs import DataSpec

    path = mm_rows(tmp_path, missing=True)
    limit = encoded_length(media_length, str(tmp_path / "big.png")) - 1
    assert limit > text_length(media_length)  # only media counting drops the big row
    spec = DataSpec.from_args(run_args(model_dir, prompt_data=str(path), rollout_max_prompt_len=limit,
                                       skip_malformed_rows=True, use_streaming_dataset=streaming))
    data = build_prompt_dataset(spec, load_tokenizer(spec))
    if streaming:  # two takes: the whole first epoch (big dropped, small, gone skipped), then small again
        labels = [s.label for s in data.take(1) + data.take(1)]
        data.close()
        assert labels == ["small", "small"] and data.num_too_long == 2 and data.num_skipped == 1
    else:
        assert [s.label for s in data] == ["small"] and data.num_too_long == 1 and data.num_skipped == 1


def test_a_text_only_run_filters_with_the_tokenizer_and_builds_no_processor(tmp_path, tokenizer_dir):
    from relax.config.schema import RelaxConfig
    from relax.engine.rollout.data_source import build_prompt_dataset, load_tokenizer, media_length
    from relax.engine.specs import DataSpec

    path = write_jsonl(tmp_path / "text.jsonl", [{"input": "what is one", "label": "a"},
                                                  {"input": "what is one plus two", "label": "b"}])
    args = RelaxConfig().replace(hf_checkpoint=str(tokenizer_dir), prompt_data=str(path), label_key="label",
                                 rollout_max_prompt_len=3).args
    spec = DataSpec.from_args(args)
    tokenizer = load_tokenizer(spec)
    assert media_length(spec, tokenizer, None) is None
    data = build_prompt_dataset(spec, tokenizer)
    assert [s.label for s in data] == ["a"] and data.num_too_long == 1
