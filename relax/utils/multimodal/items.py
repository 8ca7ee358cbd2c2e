"""The forms a media item travels in between the data row, the processor and the engine.

The rollout's side: `through_pipelines` puts a row's media through the media flags' pipelines
into the forms `MultimodalProcessor.encode` takes (images resized, videos sampled and sized with
where their audio track is, `keep_audio`; audio resampled). Then each item becomes its /generate
field, lossless, so the engine decodes exactly what the rollout processed: `image_to_data_uri`
(PNG), `audio_to_data_uri` (32-bit float WAV), `video_to_request` (PNG frames and their rate).
"""

from __future__ import annotations

import base64
import io
from typing import Any, Callable, Sequence

from relax.utils.multimodal.video_processor import video_item

PIPELINE_ITEM: dict[str, Callable[[Any], Any]] = {
    "image": lambda p: p.pixels,
    "video": lambda p: {"frames": p.frames, "fps": p.sampled_fps, "frame_times": p.frame_times},
    "audio": lambda p: {"array": p.waveform, "sampling_rate": p.sample_rate},
}


def through_pipelines(media: dict[str, Sequence[Any]] | None, pipelines: dict[str, Any] | None
                      ) -> dict[str, list[Any]]:
    """A row's media (`{"image": [items], ...}`) through the flags' pipelines, in the forms
    `MultimodalProcessor.encode` takes: images resized (uint8 [H, W, 3]), videos sampled and sized
    (`{"frames", "fps", "frame_times"}`), audio resampled (`{"array", "sampling_rate"}`). A
    modality without a pipeline passes as it is."""
    out = {k: list(v) for k, v in (media or {}).items() if v}
    for modality, pipeline in (pipelines or {}).items():
        if out.get(modality):
            out[modality] = [PIPELINE_ITEM[modality](pipeline.process(item)) for item in out[modality]]
            if modality == "video":
                out["video"] = [keep_audio(v, item) for v, item in zip(out["video"], media["video"])]
    return out


def keep_audio(processed: dict[str, Any], item: Any) -> dict[str, Any]:
    """A sampled video keeps where its audio track is, for --use-audio-in-video: a frame-list item's
    `"audio"`, or the video file itself (`"audio_source"`, decoded only when the flag asks)."""
    if isinstance(item, dict) and "frames" in item:
        if item.get("audio") is not None:
            processed["audio"] = item["audio"]
    elif not isinstance(item, (list, tuple)) and not hasattr(item, "shape"):
        processed["audio_source"] = item
    return processed


def image_to_data_uri(item: Any) -> str:
    """An image item (PIL, uint8 [H, W, 3], path, bytes, ...) as a PNG data URI: lossless, so the
    engine decodes exactly the pixels the rollout processed (SGLang accepts data URIs)."""
    from relax.utils.multimodal.image import to_pil

    buf = io.BytesIO()
    to_pil(item).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def audio_to_data_uri(waveform_T: Any, rate: int) -> str:
    """A float waveform [T] as a 32-bit float WAV data URI: lossless (16-bit PCM would round), so
    the engine decodes exactly the samples the rollout processed."""
    from relax.utils.multimodal.audio import float_wav

    return "data:audio/wav;base64," + base64.b64encode(float_wav(waveform_T, rate)).decode("ascii")


def video_to_request(item: Any) -> dict[str, Any]:
    """A video item as /generate's `video_data` entry: `{"frames": [PNG data URIs], "fps": f}` (its
    frames as given, lossless, and their rate)."""
    frames, fps, _ = video_item(item)
    return {"frames": [image_to_data_uri(frame) for frame in frames], "fps": fps}
