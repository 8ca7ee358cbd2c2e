"""`--mm-processor-pool-size`: a multimodal prompt encodes the same in a worker thread (pool size 0)
and in a pool process (its own processor and pipelines, built from the checkpoint and the data
flags): ids, encoder tensors and request fields; text prompts encode inline; a bad pool size is
refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from relax.engine.rollout.prompt_encoding import PromptEncoder
from relax.types import Sample

FLAGS = dict(image_min_token_num=None, image_max_token_num=4, image_resize_scale_factor=None,
             video_min_token_num=4, video_max_token_num=8, video_fps=None, video_fps_min_frames=None,
             video_fps_max_frames=None, frame_factor=None, audio_sample_rate=None)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer(["what is in the picture and the clip"] * 5, vocab_size=300)
    return build_tiny_vl("qwen2_5_vl", tokenizer, str(tmp_path_factory.mktemp("vl")), max_tokens=256)


def sample():
    rng = np.random.default_rng(0)
    return Sample(prompt=[{"role": "user", "content": "<image><video>what is in the picture and the clip?"}],
                  multimodal_inputs={"image": [rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)],
                                     "video": [{"frames": list(rng.integers(0, 256, (8, 56, 56, 3), dtype=np.uint8)),
                                                "fps": 4}]})


def test_threads_and_processes_encode_alike(model):
    from relax.utils.multimodal.processor import MultimodalProcessor

    flags = SimpleNamespace(**FLAGS)
    processor = MultimodalProcessor(model)
    threads = PromptEncoder(processor.tokenizer, processor, processor.pipelines(flags))
    procs = PromptEncoder(processor.tokenizer, processor, processor.pipelines(flags), pool_size=1,
                          model_path=model, data_flags=flags)

    async def both():
        a, b = sample(), sample()
        return (await threads.encode(a), a), (await procs.encode(b), b)

    try:
        ((ids_a, req_a), a), ((ids_b, req_b), b) = asyncio.run(both())
    finally:
        procs.close()
    assert ids_a == ids_b and req_a == req_b
    assert ids_a.count(processor.image_token_id) == 4  # --image-max-token-num 4 acted in both
    assert ids_a.count(processor.video_token_id) == 8  # 4 frames kept, 2x2 tokens each, 2 per slice
    assert set(a.multimodal_train_inputs) == set(b.multimodal_train_inputs) >= {"pixel_values", "video_grid_thw"}
    for key, value in a.multimodal_train_inputs.items():
        assert torch.equal(value, b.multimodal_train_inputs[key]), key


def test_text_prompts_encode_inline_and_bad_sizes_are_refused(model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids, request = asyncio.run(PromptEncoder(tokenizer).encode(Sample(prompt="what is in the picture")))
    assert ids == tokenizer.encode("what is in the picture", add_special_tokens=False) and request == {}
    with pytest.raises(ValueError, match="must be >= 0"):
        PromptEncoder(tokenizer, pool_size=-1)
    with pytest.raises(ValueError, match="needs a multimodal run"):
        PromptEncoder(tokenizer, pool_size=2)
