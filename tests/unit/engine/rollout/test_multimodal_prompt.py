"""The rollout's prompt encoding for a VL model: placeholders expanded after the chat template,
the image flags resizing each image in the model's units before its processor sees it, and the
request carrying the resized image."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from relax.engine.rollout.prompt_encoding import encode_prompt
from relax.types import Sample


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from relax.utils.multimodal.processor import MultimodalProcessor
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer(["how many red things are there"] * 5, vocab_size=300)
    path = build_tiny_vl("qwen2_5_vl", tokenizer, str(tmp_path_factory.mktemp("vl")), max_tokens=256)
    return MultimodalProcessor(path)


def flags(**kw):
    base = dict(image_min_token_num=None, image_max_token_num=None, image_resize_scale_factor=None)
    return SimpleNamespace(**(base | kw))


@pytest.mark.parametrize("max_tokens, want", [(None, 16), (4, 4)])
def test_image_flags_resize_before_the_processor(processor, max_tokens, want):
    import numpy as np

    from relax.utils.multimodal import ImageConfig, ImagePipeline

    pipeline = ImagePipeline(ImageConfig.from_flags(flags(image_max_token_num=max_tokens)))
    sample = Sample(prompt=[{"role": "user", "content": [{"type": "image", "image": None},
                                                          {"type": "text", "text": "how many red things"}]}],
                    multimodal_inputs={"image": [np.zeros((112, 112, 3), dtype=np.uint8)]})
    ids, request = encode_prompt(processor.tokenizer, processor, sample, {"image": pipeline})
    assert ids.count(processor.image_token_id) == want  # 112x112 = 16 tokens of 28x28; max 4 -> 56x56
    assert len(request["image_data"]) == 1 and request["image_data"][0].startswith("data:image/png;base64,")
    assert sample.multimodal_train_inputs["image_grid_thw"].prod().item() == 4 * want
    assert processor.request_tensors(ids, request["image_data"])["pixel_values"].shape[0] == 4 * want


def test_placeholder_and_image_counts_must_match(processor):
    from relax.utils.multimodal import MediaError

    sample = Sample(prompt="<image><image>two?", multimodal_inputs={"image": [b"x"]})
    with pytest.raises(MediaError, match="2 <image> placeholder"):
        encode_prompt(processor.tokenizer, processor, sample)
