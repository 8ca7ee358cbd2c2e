"""Video pipeline: frames sampled by fps and frame bounds, each resized like an image -> vision tokens.

Algorithm (qwen-vl-utils `smart_nframes` and `fetch_video`):
1. frames wanted = total_frames / source_fps * `--video-fps`, clamped to
   [ceil_to_factor(`--video-fps-min-frames`), floor_to_factor(min(`--video-fps-max-frames`, total))]
   and to the frames there are, then floored to a multiple of `--frame-factor` (the encoder's
   temporal patch: two frames make one temporal token slice);
2. the frames kept are `linspace(0, total - 1, n)` rounded (evenly spread, first and last kept);
3. every frame is resized to the first frame's `smart_resize` size within the per-frame bounds
   `--video-min-token-num` / `--video-max-token-num` (times 28^2 pixels);
4. tokens = (n / frame_factor) * (H / patch) * (W / patch) / merge^2.

Input: a list of frames (each in any form the image pipeline takes) at `default_source_fps`,
or `{"frames": [...], "fps": <source fps>}`. Decoding a video *file* needs an FFmpeg binding
(PyAV), which this build does not ship: such an item is a `MediaError` saying so.
Simplification: qwen-vl-utils' total-pixel budget across frames is not applied (the per-frame
bounds are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from relax.utils.multimodal.config import VideoConfig
from relax.utils.multimodal.image import smart_resize, to_pil
from relax.utils.multimodal.sources import MediaError, describe


def num_sampled_frames(total_frames: int, source_fps: float, cfg: VideoConfig) -> int:
    """How many of `total_frames` (recorded at `source_fps`) are kept (step 1 above)."""
    factor = cfg.frame_factor
    if total_frames < factor:
        raise MediaError(f"video has {total_frames} frame(s); at least --frame-factor={factor} are needed")
    min_frames = math.ceil(cfg.min_frames / factor) * factor
    max_frames = math.floor(min(cfg.max_frames, total_frames) / factor) * factor
    wanted = total_frames / source_fps * cfg.fps
    wanted = min(max(wanted, min_frames), max_frames, total_frames)
    return max(factor, math.floor(wanted / factor) * factor)


def sample_indices(total_frames: int, num_frames: int) -> list[int]:
    """`num_frames` indices spread evenly over [0, total_frames - 1] (numpy.linspace, rounded)."""
    import numpy as np

    return [int(i) for i in np.linspace(0, total_frames - 1, num_frames).round()]


@dataclass(frozen=True)
class ProcessedVideo:
    frames: Any                      # uint8 tensor [T, H, W, 3]
    indices: list[int]               # which source frames were kept
    grid_thw: tuple[int, int, int]   # (T / frame_factor, H / patch, W / patch), as `video_grid_thw`
    num_tokens: int
    source_fps: float = 30.0         # the rate of the source frames (`indices` count in it)
    sampled_fps: float = 2.0         # the rate of the kept frames: len(indices) / duration

    @property
    def frame_times(self) -> list[float]:
        """Each kept frame's time in seconds (its source index / source fps)."""
        return [i / self.source_fps for i in self.indices]


def _frames_and_fps(item: Any, cfg: VideoConfig) -> tuple[list, float]:
    if isinstance(item, dict) and "frames" in item:
        fps = float(item.get("fps") or cfg.default_source_fps)
        if fps <= 0:
            raise MediaError(f"video: source fps must be > 0, got {fps}")
        return list(item["frames"]), fps
    if isinstance(item, (list, tuple)):
        return list(item), cfg.default_source_fps
    if hasattr(item, "shape") and len(item.shape) == 4:  # array/tensor [T, H, W, 3]
        return [item[i] for i in range(item.shape[0])], cfg.default_source_fps
    raise MediaError(f"video {describe(item)}: decoding video files needs PyAV (FFmpeg), which this build does "
                     "not ship; store the video as a list of frames or {'frames': [...], 'fps': <fps>}")


class VideoPipeline:
    """item -> ProcessedVideo, per `VideoConfig` (see the module docstring)."""

    def __init__(self, cfg: VideoConfig) -> None:
        self.cfg = cfg
        self.frame_cfg = cfg.frame_image_config()

    def process(self, item: Any) -> ProcessedVideo:
        import numpy as np
        import torch
        from PIL import Image

        frames, source_fps = _frames_and_fps(item, self.cfg)
        indices = sample_indices(len(frames), num_sampled_frames(len(frames), source_fps, self.cfg))
        images = [to_pil(frames[i], kind=f"video frame {i}") for i in indices]
        fc = self.frame_cfg
        height, width = smart_resize(images[0].height, images[0].width, factor=fc.unit,
                                     min_pixels=fc.min_pixels, max_pixels=fc.max_pixels)
        resized = [np.asarray(im if im.size == (width, height) else im.resize((width, height),
                                                                             Image.Resampling.BICUBIC))
                   for im in images]
        grid = (len(indices) // self.cfg.frame_factor, height // fc.patch_size, width // fc.patch_size)
        return ProcessedVideo(frames=torch.from_numpy(np.stack(resized)),  # [T, H, W, 3]
                              indices=indices, grid_thw=grid,
                              num_tokens=grid[0] * grid[1] * grid[2] // fc.merge_size ** 2,
                              source_fps=source_fps, sampled_fps=len(indices) * source_fps / len(frames))
