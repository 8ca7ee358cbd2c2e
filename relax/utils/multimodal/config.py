"""Per-modality settings built from the seed's multimodal flags (not the whole `args`).

Each pipeline takes one of these small frozen dataclasses. `*.from_flags(data_config)` reads
the `DataConfig` group (or any object with those flag attributes, e.g. `DataSpec`); an unset
flag (None) takes the seed's documented default, which is also qwen-vl-utils' default:

| flag                          | default | used by |
|-------------------------------|---------|---------|
| --image-min-token-num         | 4       | ImageConfig.min_tokens |
| --image-max-token-num         | 16384   | ImageConfig.max_tokens |
| --image-resize-scale-factor   | 28      | ImageConfig.resize_factor (0 = no alignment) |
| --video-min-token-num         | 128     | VideoConfig.min_tokens (per frame) |
| --video-max-token-num         | 768     | VideoConfig.max_tokens (per frame) |
| --video-fps                   | 2.0     | VideoConfig.fps |
| --video-fps-min-frames        | 4       | VideoConfig.min_frames |
| --video-fps-max-frames        | 768     | VideoConfig.max_frames |
| --frame-factor                | 2       | VideoConfig.frame_factor |
| --audio-sample-rate           | 16000   | AudioConfig.sample_rate |

One vision token covers `(patch_size * merge_size)^2` pixels (14 * 2 = 28: Qwen2-VL / 2.5-VL;
Qwen3-VL uses patch 16, so 32), which is why pixel bounds are token bounds times 28^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _or(value: Any, default: Any) -> Any:
    """An unset flag (None) takes the seed's default."""
    return default if value is None else value


def _positive(flag: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{flag} must be > 0, got {value}")


@dataclass(frozen=True)
class ImageConfig:
    min_tokens: int = 4
    max_tokens: int = 16384
    resize_factor: int = 28  # pre-resize alignment; 0 = keep the size (only the pixel bounds apply)
    patch_size: int = 14     # the vision encoder's patch (the processor's own alignment is patch * merge)
    merge_size: int = 2      # spatial merge: merge_size^2 patches -> one LLM token

    def __post_init__(self) -> None:
        _positive("--image-min-token-num", self.min_tokens)
        _positive("--image-max-token-num", self.max_tokens)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"--image-min-token-num ({self.min_tokens}) must be <= --image-max-token-num "
                             f"({self.max_tokens})")
        if self.resize_factor < 0:
            raise ValueError(f"--image-resize-scale-factor must be >= 0 (0 = no alignment), got {self.resize_factor}")

    @property
    def unit(self) -> int:
        """Pixels along one side of one LLM token (patch_size * merge_size)."""
        return self.patch_size * self.merge_size

    @property
    def min_pixels(self) -> int:
        return self.min_tokens * self.unit ** 2

    @property
    def max_pixels(self) -> int:
        return self.max_tokens * self.unit ** 2

    @classmethod
    def from_flags(cls, flags: Any, *, patch_size: int = 14, merge_size: int = 2) -> ImageConfig:
        """From the data flags; `patch_size` / `merge_size`: the model's (the alignment default is
        their product, 28 for Qwen2.5-VL, 32 for Qwen3-VL)."""
        return cls(min_tokens=_or(flags.image_min_token_num, 4),
                   max_tokens=_or(flags.image_max_token_num, 16384),
                   resize_factor=_or(flags.image_resize_scale_factor, patch_size * merge_size),
                   patch_size=patch_size, merge_size=merge_size)


@dataclass(frozen=True)
class VideoConfig:
    min_tokens: int = 128   # per frame
    max_tokens: int = 768   # per frame
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    frame_factor: int = 2   # frame counts are multiples of this (the encoder's temporal patch)
    default_source_fps: float = 30.0  # a frame list without its own fps is taken as 30 fps video
    patch_size: int = 14
    merge_size: int = 2

    def __post_init__(self) -> None:
        for flag, value in (("--video-min-token-num", self.min_tokens), ("--video-max-token-num", self.max_tokens),
                            ("--video-fps", self.fps), ("--video-fps-min-frames", self.min_frames),
                            ("--video-fps-max-frames", self.max_frames), ("--frame-factor", self.frame_factor)):
            _positive(flag, value)
        if self.min_frames > self.max_frames:
            raise ValueError(f"--video-fps-min-frames ({self.min_frames}) must be <= --video-fps-max-frames "
                             f"({self.max_frames})")

    def frame_image_config(self) -> ImageConfig:
        """Frames are resized like images, within the per-frame video token bounds."""
        return ImageConfig(min_tokens=self.min_tokens, max_tokens=max(self.min_tokens, self.max_tokens),
                           resize_factor=self.patch_size * self.merge_size, patch_size=self.patch_size,
                           merge_size=self.merge_size)

    @classmethod
    def from_flags(cls, flags: Any, *, patch_size: int = 14, merge_size: int = 2) -> VideoConfig:
        """From the data flags; `patch_size` / `merge_size`: the model's (frames are sized in its units)."""
        return cls(patch_size=patch_size, merge_size=merge_size,
                   min_tokens=_or(flags.video_min_token_num, 128),
                   max_tokens=_or(flags.video_max_token_num, 768),
                   fps=float(_or(flags.video_fps, 2.0)),
                   min_frames=_or(flags.video_fps_min_frames, 4),
                   max_frames=_or(flags.video_fps_max_frames, 768),
                   frame_factor=_or(flags.frame_factor, 2))


@dataclass(frozen=True)
class AudioConfig:
    sample_rate: int = 16000
    max_seconds: float = 30.0  # Whisper-style feature extractors read at most one 30 s chunk
    hop_length: int = 160      # samples per feature frame (10 ms at 16 kHz)

    def __post_init__(self) -> None:
        _positive("--audio-sample-rate", self.sample_rate)
        _positive("AudioConfig.max_seconds", self.max_seconds)
        _positive("AudioConfig.hop_length", self.hop_length)

    @property
    def max_samples(self) -> int:
        return int(round(self.max_seconds * self.sample_rate))

    @classmethod
    def from_flags(cls, flags: Any) -> AudioConfig:
        return cls(sample_rate=_or(flags.audio_sample_rate, 16000))
