"""A video item as the Qwen-VL video processor takes it, without torchvision.

Transformers' Qwen-VL / Omni video processors need torchvision; this is their rule, from the
checkpoint's settings (`VideoSettings`): a video item (frames already sampled and sized by the
video pipeline, `video.py`, and their rate) -> its frame times (`video_item`), the time of each
temporal slice (`slice_times`, Qwen3-VL's `<t seconds>` timestamps) and its patch rows
(`patchify_video`: rescaled, normalised, T padded to the temporal patch, patches ordered merge
window by merge window, as `pixel_values_videos`). `MultimodalProcessor` builds its video
tensors and token spans from these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from relax.utils.multimodal.sources import MediaError

DEFAULT_VIDEO_FPS = 2.0  # the rate of a bare frame list (the --video-fps default: frames are sampled at it)


def video_item(item: Any) -> tuple[list[Any], float, list[float]]:
    """(frames, fps, each frame's time in seconds) of a video item as the processor takes it: frames
    already sampled and sized (the video pipeline's work): `{"frames": [...], "fps": f,
    "frame_times": [...]}` (fps and times optional) or a bare frame list / uint8 [T, H, W, 3]
    array, whose frames are taken to be `DEFAULT_VIDEO_FPS` apart."""
    if isinstance(item, dict) and "frames" in item:
        frames, fps, times = item["frames"], item.get("fps") or DEFAULT_VIDEO_FPS, item.get("frame_times")
    elif isinstance(item, (list, tuple)) or (hasattr(item, "shape") and len(item.shape) == 4):
        frames, fps, times = item, DEFAULT_VIDEO_FPS, None
    else:
        raise MediaError(f"a video item must be a list of frames or {{'frames': [...], 'fps': <fps>}}, got "
                         f"{type(item).__name__} (video files go through the video pipeline first)")
    frames = [frames[i] for i in range(len(frames))]
    if not frames:
        raise MediaError("a video item has no frames")
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or fps <= 0:
        raise MediaError(f"video fps must be a positive number, got {fps!r}")
    times = [i / fps for i in range(len(frames))] if times is None else [float(t) for t in times]
    if len(times) != len(frames):
        raise MediaError(f"a video item has {len(frames)} frames but {len(times)} frame_times")
    return frames, float(fps), times


def slice_times(frame_times: Sequence[float], temporal_patch: int) -> list[float]:
    """The time of each temporal slice (`temporal_patch` frames, the last frame repeated to fill the
    final one): the mean of its first and last frame's times (Qwen3-VL's timestamps)."""
    times = list(frame_times)
    times += [times[-1]] * (-len(times) % temporal_patch)
    return [(times[i] + times[i + temporal_patch - 1]) / 2 for i in range(0, len(times), temporal_patch)]


def patchify_video(frames_THWC: Any, settings: VideoSettings) -> tuple[Any, tuple[int, int, int]]:
    """uint8 frames [T, H, W, 3] -> (`pixel_values_videos` rows [t*h*w, 3*tp*p*p], (t, h, w)), the Qwen-VL
    video processor's layout: rescaled and normalised, T padded to a multiple of the temporal patch
    `tp` with the last frame, patches ordered merge window by merge window (an image is a video of
    `tp` equal frames)."""
    import torch

    p, tp, m = settings.patch_size, settings.temporal_patch_size, settings.merge_size
    x = torch.as_tensor(frames_THWC).permute(0, 3, 1, 2).to(torch.float32) * settings.rescale_factor
    mean = torch.tensor(settings.mean, dtype=torch.float32)[None, :, None, None]
    std = torch.tensor(settings.std, dtype=torch.float32)[None, :, None, None]
    x = (x - mean) / std
    if x.shape[0] % tp:
        x = torch.cat([x, x[-1:].expand(tp - x.shape[0] % tp, -1, -1, -1)])
    t, c, height, width = x.shape[0] // tp, x.shape[1], x.shape[2], x.shape[3]
    h, w = height // p, width // p
    x = x.reshape(t, tp, c, h // m, m, p, w // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(t * h * w, c * tp * p * p), (t, h, w)


@dataclass(frozen=True)
class VideoSettings:
    """The checkpoint's video processor settings (`video_preprocessor_config.json`, else its image
    processor's: Qwen2.5-VL keeps one file for both)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float

    @classmethod
    def load(cls, model_path: str, image_processor: Any) -> VideoSettings:
        import json
        import os

        cfg: dict[str, Any] = {}
        path = os.path.join(model_path, "video_preprocessor_config.json")
        if os.path.isfile(path):
            with open(path) as f:
                cfg = json.load(f)

        def get(name: str, default: Any = None) -> Any:
            return cfg.get(name, getattr(image_processor, name, default))

        return cls(patch_size=int(get("patch_size")), temporal_patch_size=int(get("temporal_patch_size", 2)),
                   merge_size=int(get("merge_size")), mean=tuple(float(v) for v in get("image_mean")),
                   std=tuple(float(v) for v in get("image_std")), rescale_factor=float(get("rescale_factor", 1 / 255)))
