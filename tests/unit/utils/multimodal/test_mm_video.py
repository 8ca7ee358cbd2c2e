"""Video pipeline: frames sampled by fps / min / max frames and the per-frame token bounds."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from relax.utils.multimodal import MediaError, VideoConfig, VideoPipeline
from relax.utils.multimodal.video import num_sampled_frames, sample_indices


def frames(count: int, size: int = 56) -> list:
    return [np.full((size, size, 3), i, dtype=np.uint8) for i in range(count)]


@pytest.mark.parametrize("total, source_fps, fps, expected", [
    (60, 30.0, 2.0, 4),    # 2 s at 2 fps = 4 frames
    (300, 30.0, 2.0, 20),  # 10 s -> 20
    (300, 30.0, 1.0, 10),
    (10, 30.0, 2.0, 4),    # raised to --video-fps-min-frames
    (7, 30.0, 2.0, 4),
])
def test_frame_count_follows_fps_and_min_frames(total, source_fps, fps, expected):
    assert num_sampled_frames(total, source_fps, VideoConfig(fps=fps)) == expected


def test_frame_count_is_capped_by_max_frames_and_is_a_multiple_of_frame_factor():
    assert num_sampled_frames(3000, 30.0, VideoConfig(max_frames=9)) == 8
    assert num_sampled_frames(300, 30.0, VideoConfig(fps=1.5, frame_factor=4)) == 12
    assert num_sampled_frames(3, 30.0, VideoConfig()) == 2  # fewer frames than min_frames: all, floored


def test_too_few_frames_is_a_media_error():
    with pytest.raises(MediaError, match="--frame-factor"):
        num_sampled_frames(1, 30.0, VideoConfig())


def test_sampled_indices_spread_evenly_and_keep_both_ends():
    assert sample_indices(60, 4) == [0, 20, 39, 59]


def test_video_tokens_follow_frames_and_per_frame_bounds():
    cfg = VideoConfig(min_tokens=4, max_tokens=16)
    result = VideoPipeline(cfg).process({"frames": frames(60, size=224), "fps": 30})
    assert result.indices == [0, 20, 39, 59]
    assert tuple(result.frames.shape) == (4, 112, 112, 3)  # 224^2 > 16 tokens: down to 4x4 tokens
    assert result.grid_thw == (2, 8, 8)
    assert result.num_tokens == 2 * 16
    assert result.frames[1, 0, 0, 0].item() == 20  # the sampled frame, not the first


def test_frame_list_without_fps_uses_the_default_source_fps():
    result = VideoPipeline(VideoConfig(min_tokens=4, max_tokens=4)).process(frames(90))
    assert len(result.indices) == 6  # 3 s at 30 fps, 2 fps


def test_a_video_file_is_a_clear_error_without_pyav(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # decoding real files: test_video_files.py
    with pytest.raises(MediaError, match=r"'clip\.mp4'.*PyAV.*pip install av"):
        VideoPipeline(VideoConfig()).process("clip.mp4")


def test_video_flags_name_the_flag():
    with pytest.raises(ValueError, match="--video-fps "):
        VideoConfig(fps=0)
