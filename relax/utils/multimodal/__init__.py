"""Media pipelines: images, video and audio from a data row to what a Qwen-VL / Omni processor expects.

Why: a multimodal prompt's length, and so batching and `--rollout-max-prompt-len`, depend on how
many tokens each `<image>` / `<video>` / `<audio>` placeholder expands to, and that depends on the
resize, frame-sampling and resampling rules the model's processor applies. These pipelines apply
the same rules, configured by the seed's flags (`relax.utils.multimodal.config`), so the data
layer can resize, sample and count before anything reaches an engine.

- `sources`: an item's bytes from a local path, `file://`, `http(s)://` (with a timeout),
  a `data:...;base64,` URI, raw bytes or an HF `{"bytes", "path"}` struct.
- `image`: smart resize within [min, max] pixels -> `ProcessedImage` (pixels, grid, tokens).
- `video`: frames sampled by fps / min / max frames, resized per frame -> `ProcessedVideo`.
- `audio`: WAV decode, resample to the processor's rate, cut to max length -> `ProcessedAudio`.

`PIPELINES` is the one modality -> pipeline registry; `build_pipelines(flags)` builds each from
its own small config. Every failure is a `MediaError` naming the item.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from relax.utils.multimodal.audio import AudioPipeline, ProcessedAudio
from relax.utils.multimodal.config import AudioConfig, ImageConfig, VideoConfig
from relax.utils.multimodal.image import ImagePipeline, ProcessedImage
from relax.utils.multimodal.sources import MediaError, read_bytes
from relax.utils.multimodal.video import ProcessedVideo, VideoPipeline

__all__ = ["PIPELINES", "AudioConfig", "AudioPipeline", "ImageConfig", "ImagePipeline", "MediaError",
           "MediaPipeline", "ProcessedAudio", "ProcessedImage", "ProcessedVideo", "VideoConfig", "VideoPipeline",
           "build_pipelines", "read_bytes"]


class MediaPipeline(Protocol):
    def process(self, item: Any) -> Any: ...


# modality (the key of --multimodal-keys) -> (builder from the flags, pipeline)
PIPELINES: dict[str, Callable[[Any], MediaPipeline]] = {
    "image": lambda flags: ImagePipeline(ImageConfig.from_flags(flags)),
    "video": lambda flags: VideoPipeline(VideoConfig.from_flags(flags)),
    "audio": lambda flags: AudioPipeline(AudioConfig.from_flags(flags)),
}


def build_pipelines(flags: Any, modalities: Any = None) -> dict[str, MediaPipeline]:
    """One pipeline per modality (all, or those named), configured by `flags` (e.g. the DataConfig group)."""
    names = list(PIPELINES) if modalities is None else list(modalities)
    unknown = sorted(set(names) - set(PIPELINES))
    if unknown:
        raise ValueError(f"--multimodal-keys: unknown type(s) {unknown}; known types are {sorted(PIPELINES)}")
    return {name: PIPELINES[name](flags) for name in names}
