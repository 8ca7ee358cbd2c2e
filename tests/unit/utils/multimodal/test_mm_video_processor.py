"""The Qwen-VL video processor's rule without torchvision: the patch layout is the Qwen-VL
processors' (a video of two equal frames is exactly an image, an odd frame count repeats the last
frame), and each temporal slice's time is the mean of its frames' times (Qwen3-VL's timestamps)."""

from __future__ import annotations

import numpy as np
import pytest

from relax.utils.multimodal.video_processor import VideoSettings, patchify_video, slice_times


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def checkpoint(request, tmp_path_factory):
    """A tiny VL checkpoint's image processor and its video settings."""
    from transformers import AutoImageProcessor

    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer(["what moves here"] * 10, vocab_size=300)
    path = build_tiny_vl(request.param, tokenizer, str(tmp_path_factory.mktemp(request.param)))
    image_processor = AutoImageProcessor.from_pretrained(path)
    return image_processor, VideoSettings.load(path, image_processor)


def noise(frames: int, height: int, width: int, seed: int = 0):
    return np.random.default_rng(seed).integers(0, 256, size=(frames, height, width, 3), dtype=np.uint8)


def test_two_equal_frames_are_exactly_an_image(checkpoint):
    image_processor, video = checkpoint
    unit = video.patch_size * video.merge_size
    image = noise(1, 2 * unit, 3 * unit)[0]
    ref = image_processor(images=[image], return_tensors="pt")
    rows, grid = patchify_video(np.stack([image, image]), video)
    assert [list(grid)] == ref["image_grid_thw"].tolist()
    assert rows.shape == ref["pixel_values"].shape
    assert (rows - ref["pixel_values"]).abs().max().item() < 1e-5


def test_odd_frame_counts_repeat_the_last_frame(checkpoint):
    _, video = checkpoint
    unit = video.patch_size * video.merge_size
    frames = noise(3, unit, unit)
    odd, grid = patchify_video(frames, video)
    even, _ = patchify_video(np.concatenate([frames, frames[-1:]]), video)
    assert grid[0] == 2 and (odd - even).abs().max().item() == 0


def test_slice_times_average_each_temporal_patch():
    assert slice_times([0.0, 0.5, 1.0, 1.5], 2) == [0.25, 1.25]
    assert slice_times([0.0, 0.5, 1.0], 2) == [0.25, 1.0]  # the last frame repeated
