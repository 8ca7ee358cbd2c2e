"""Cheap media checks for the in-memory dataset: is each item of a row there and decodable?

The in-memory `PromptDataset` keeps media references (paths, bytes) and leaves decoding to the
processor, so a missing or corrupt file would otherwise surface only when an engine reads it,
far from the row. `check_row_media` reads each local item once at load time: images must open
and pass PIL's `verify()` (header and structure, no full decode), WAV audio must parse, non-WAV
audio must be readable, a frame-list video's frames are checked as images, and a video file must
open with PyAV, hold a video stream and decode its first frame (one frame, not the whole video;
a local file is read from disk by FFmpeg, not loaded whole). URLs are not fetched here (that
would download the dataset at start-up); they are checked when fetched. Errors are `MediaError`s
naming the column and the item, which the loader turns into a per-row `DataError` (or a skipped
row with `--skip-malformed-rows`).
"""

from __future__ import annotations

import io
import wave
from typing import Any

from relax.utils.multimodal.sources import MediaError, describe, read_bytes


def _check_image(data: bytes, item: Any) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:  # PIL's verify raises SyntaxError too
        raise MediaError(f"image {describe(item)}: not a decodable image ({exc})") from exc


def _check_audio(data: bytes, item: Any) -> None:
    if not data.startswith(b"RIFF"):  # mp3 / flac / ogg: decoded through PyAV (the pipeline's own decoder)
        from relax.utils.multimodal.audio import decode_compressed

        decode_compressed(data, item)
        return
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            wav.getnframes()
    except (wave.Error, EOFError) as exc:
        raise MediaError(f"audio {describe(item)}: not a readable WAV file ({exc})") from exc


def _check_video(item: Any) -> None:
    if isinstance(item, (list, tuple, dict)) and not _is_struct(item):  # frames, or {"frames": [...], "fps": ...}
        for frame in (item["frames"] if isinstance(item, dict) else item):
            check_item("image", frame)
        return
    from relax.utils.multimodal.video import check_video_file

    check_video_file(item)  # a MediaError naming the item (and `pip install av` when PyAV is missing)


_CHECKS = {"image": _check_image, "audio": _check_audio}  # these check the item's bytes
_KINDS = (*_CHECKS, "video")


def check_item(kind: str, item: Any) -> None:
    """MediaError if a local/inline `item` of this modality is missing or corrupt; URLs pass."""
    if isinstance(item, str) and item.startswith(("http://", "https://")):
        return
    if hasattr(item, "shape") or (isinstance(item, dict) and item.get("array") is not None):
        return  # already decoded
    if kind == "video":
        _check_video(item)
        return
    _CHECKS[kind](read_bytes(item, kind), item)


def _is_struct(item: Any) -> bool:
    return isinstance(item, dict) and ("bytes" in item or "path" in item)


def check_row_media(row: dict, multimodal_keys: dict[str, str]) -> None:
    """Check every media item of `row` (ValueError naming the column and the item)."""
    for kind, column in multimodal_keys.items():
        value = row.get(column)
        if value is None or kind not in _KINDS:
            continue  # unknown kinds are reported by the formatter with the known ones
        if type(value).__module__ == "numpy":  # object arrays from pandas-written parquet
            value = value.tolist()
        items = value if isinstance(value, (list, tuple)) else [value]
        try:
            for item in items:
                check_item(kind, item)
        except MediaError as exc:
            raise MediaError(f"column {column!r}: {exc}") from exc
