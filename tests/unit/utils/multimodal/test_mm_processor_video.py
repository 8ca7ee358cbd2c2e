"""Video through `MultimodalProcessor`: each family lays out its video tokens as its processor does
(Qwen2.5-VL one block and seconds per temporal grid, Qwen3-VL one timestamped block per temporal
slice), the counts follow the video flags, and bad video inputs fail with errors that say what to
fix; /generate's `video_data` payload is checked the same way."""

from __future__ import annotations

import numpy as np
import pytest

from relax.utils.multimodal import VideoConfig, VideoPipeline
from relax.utils.multimodal.items import through_pipelines, video_to_request
from relax.utils.multimodal.processor import MultimodalProcessor
from relax.utils.multimodal.sources import MediaError


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def processor(request, tmp_path_factory):
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer(["what moves here"] * 10, vocab_size=300)
    return MultimodalProcessor(build_tiny_vl(request.param, tokenizer, str(tmp_path_factory.mktemp(request.param))))


def noise(frames: int, height: int, width: int, seed: int = 0):
    return np.random.default_rng(seed).integers(0, 256, size=(frames, height, width, 3), dtype=np.uint8)


def pipelines(processor, **flags):
    cfg = VideoConfig(patch_size=processor.video.patch_size, merge_size=processor.video.merge_size, **flags)
    return {"video": VideoPipeline(cfg)}


def test_each_family_lays_out_its_video_tokens(processor):
    media = through_pipelines({"video": [{"frames": list(noise(10, 64, 64)), "fps": 5}]},
                              pipelines(processor, min_tokens=4, max_tokens=8))
    encoded = processor.encode("<video>hi", media)
    text = processor.tokenizer.decode(encoded.input_ids)
    assert encoded.tensors["video_grid_thw"].tolist() == [[2, 4, 4]]  # frames 0, 3, 6, 9 kept: 2 slices of 2x2
    assert encoded.input_ids.count(processor.video_token_id) == 8
    if processor.family.video_timestamps:  # Qwen3-VL: frames at 0.0/0.6 and 1.2/1.8 s -> slices at 0.3 and 1.5 s
        assert text.startswith("<0.3 seconds><|vision_start|>" + "<|video_pad|>" * 4 + "<|vision_end|>"
                               "<1.5 seconds><|vision_start|>")
        assert "second_per_grid_ts" not in encoded.tensors
    else:  # Qwen2.5-VL: one block; 4 frames of a 2 s clip -> 2 fps -> 1 s per temporal grid of 2 frames
        assert text.startswith("<|vision_start|>" + "<|video_pad|>" * 8 + "<|vision_end|>hi")
        assert encoded.tensors["second_per_grid_ts"].tolist() == [1.0]
    request = encoded.request["video_data"][0]
    assert request["fps"] == 2.0 and len(request["frames"]) == 4 and request["frames"][0].startswith("data:image/png")
    # The engine's side: the request alone gives the same tensors, checked against the ids.
    again = processor.request_tensors(encoded.input_ids, None, None, encoded.request["video_data"])
    assert all((again[k] == v).all() for k, v in encoded.tensors.items())


def test_video_flags_set_the_counts(processor):
    clip = {"frames": list(noise(40, 96, 128)), "fps": 10}  # 4 s
    few = processor.encode("<video>", through_pipelines({"video": [clip]}, pipelines(processor, min_tokens=4,
                                                                                      max_tokens=6, fps=1.0)))
    many = processor.encode("<video>", through_pipelines({"video": [clip]}, pipelines(processor, min_tokens=4,
                                                                                       max_tokens=24, fps=2.0)))
    t_few, h_few, w_few = few.tensors["video_grid_thw"][0].tolist()
    t_many, h_many, w_many = many.tensors["video_grid_thw"][0].tolist()
    assert (t_few, t_many) == (2, 4)  # --video-fps 1 keeps 4 frames, 2 keeps 8 (2 frames per slice)
    assert h_few * w_few // 4 <= 6 < h_many * w_many // 4 <= 24  # --video-max-token-num bounds each frame
    for enc, (t, h, w) in ((few, (t_few, h_few, w_few)), (many, (t_many, h_many, w_many))):
        assert enc.input_ids.count(processor.video_token_id) == t * h * w // 4


def test_bad_video_inputs_say_what_to_fix(processor):
    unit = processor.video.patch_size * processor.video.merge_size
    with pytest.raises(MediaError, match=f"multiples of {unit} pixels"):
        processor.video_tensors([{"frames": list(noise(2, unit + 3, unit)), "fps": 2}])
    with pytest.raises(MediaError, match="one size"):
        processor.video_tensors([{"frames": [noise(1, unit, unit)[0], noise(1, unit, 2 * unit)[0]], "fps": 2}])
    with pytest.raises(MediaError, match="fps must be a positive number"):
        processor.video_tensors([{"frames": list(noise(2, unit, unit)), "fps": -1}])
    with pytest.raises(MediaError, match="no frames"):
        processor.video_tensors([{"frames": [], "fps": 2}])
    with pytest.raises(MediaError, match=r"1 <video> placeholder\(s\) for 0 video"):
        processor.encode("<video>hi", {})
    good = {"frames": list(noise(2, unit, unit)), "fps": 2}
    with pytest.raises(MediaError, match="input_ids hold 0 video pad token"):
        processor.request_tensors([1, 2, 3], None, None, [video_to_request(good)])


def test_generate_payload_checks_video_items():
    from relax.backends.hf.protocol import GenerateRequest, _media

    frame = "data:image/png;base64,AAAA"
    ok = GenerateRequest(input_ids=[1], video_data=[{"frames": [frame, frame], "fps": 2}])
    assert _media(ok, 1, False) == [{"video": [{"frames": [frame, frame], "fps": 2}]}]
    assert _media(GenerateRequest(input_ids=[1], video_data="clip.mp4"), 1, False) == [{"video": ["clip.mp4"]}]
    for bad in ({"frames": [], "fps": 2}, {"frames": [frame], "fps": 0}, {"frames": [frame], "rate": 2},
                {"frames": [3], "fps": 2}):
        with pytest.raises(ValueError, match="video_data of prompt 0"):
            _media(GenerateRequest(input_ids=[1], video_data=[bad]), 1, False)
    with pytest.raises(ValueError, match="image_data of prompt 0: each item must be a non-empty string"):
        _media(GenerateRequest(input_ids=[1], image_data=[{"frames": [frame]}]), 1, False)
