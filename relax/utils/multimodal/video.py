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
or `{"frames": [...], "fps": <source fps>}`, or a video *file* (mp4, webm, mkv, avi, ...: any
container and codec FFmpeg reads) in any form `sources.read_bytes` takes (a local or `file://`
path, bytes, an HF `{"bytes", "path"}` struct, a `data:video/...;base64,` URI, an http(s) URL)
or as raw base64 (SGLang's `video_data` form).
A file is decoded with PyAV (FFmpeg's Python binding; its wheels bundle FFmpeg, so no system
install; the optional extra `relax-rl[video]`): the source fps is the stream's average rate
(else FFmpeg's guess, else frames / duration), the frame count the container's (counted by
demuxing, no decoding, when the container does not say, as webm and mkv do not); then the
frames are decoded in order, stopping after the last sampled one and keeping only the sampled
ones as RGB uint8 arrays, so a long video never has more than the kept frames in memory. A file
whose header over-counts (a truncated upload) is sampled again over the frames that decode. A
local path is read by FFmpeg from disk, not loaded whole. Without PyAV, a file is a `MediaError`
naming it and the fix (`pip install av`); a corrupt file, or one with no video stream, is a
`MediaError` naming it and what is wrong.
Simplification: qwen-vl-utils' total-pixel budget across frames is not applied (the per-frame
bounds are).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from relax.utils.multimodal.config import VideoConfig
from relax.utils.multimodal.image import smart_resize, to_pil
from relax.utils.multimodal.sources import MediaError, describe, read_bytes

_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_MIN_BASE64_CHARS = 64  # shorter strings are taken as paths: no video file is that small


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


@dataclass(frozen=True)
class SampledFrames:
    """The frames kept from one video, before resizing."""
    frames: list                     # one frame per index, in any form `to_pil` takes
    indices: list[int]
    source_fps: float
    total_frames: int


def _frames_and_fps(item: Any, cfg: VideoConfig) -> tuple[list, float] | None:
    """(frames, source fps) of a frame-list item; None for a video file."""
    if isinstance(item, dict) and "frames" in item:
        fps = float(item.get("fps") or cfg.default_source_fps)
        if fps <= 0:
            raise MediaError(f"video: source fps must be > 0, got {fps}")
        return list(item["frames"]), fps
    if isinstance(item, (list, tuple)):
        return list(item), cfg.default_source_fps
    if hasattr(item, "shape") and len(item.shape) == 4:  # array/tensor [T, H, W, 3]
        return [item[i] for i in range(item.shape[0])], cfg.default_source_fps
    return None


def sample_frames(item: Any, cfg: VideoConfig) -> SampledFrames:
    """The frames of a video item kept per `cfg` (steps 1-2 above); a file is decoded with PyAV."""
    listed = _frames_and_fps(item, cfg)
    if listed is None:
        return read_video_file(item, cfg)
    frames, fps = listed
    indices = sample_indices(len(frames), num_sampled_frames(len(frames), fps, cfg))
    return SampledFrames([frames[i] for i in indices], indices, fps, len(frames))


# ---- video files (PyAV) ------------------------------------------------------------------


def import_av(name: str) -> Any:
    """The `av` module, or a MediaError naming the video and how to install PyAV."""
    try:
        import av
    except ImportError as exc:
        raise MediaError(f"video {name}: decoding a video file needs PyAV (FFmpeg's Python binding), which is "
                         "not installed; `pip install av` (or the extra: `pip install 'relax-rl[video]'`), or store "
                         "the video as a list of frames or {'frames': [...], 'fps': <fps>}") from exc
    return av


def _is_raw_base64(item: Any) -> bool:
    """A raw base64 string (SGLang's `video_data` form), not a path (an existing file is a path)."""
    return (isinstance(item, str) and len(item) >= _MIN_BASE64_CHARS and not len(item) % 4
            and _BASE64.fullmatch(item) is not None and not os.path.exists(item))


def _name(item: Any) -> str:
    """A log-safe name of a video item (`describe`, and no raw base64 payload)."""
    return f"<{len(item)} characters of base64>" if _is_raw_base64(item) else describe(item)


def _source(item: Any, name: str, kind: str = "video") -> str | bytes:
    """A local file's path (FFmpeg reads it from disk, not loaded whole), else the file's bytes."""
    if _is_raw_base64(item):
        try:
            return base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MediaError(f"video {name}: invalid base64 ({exc})") from exc
    path = item.get("path") if isinstance(item, dict) and item.get("bytes") is None else item
    if isinstance(path, str) and not path.startswith(("data:", "http://", "https://")):
        path = path[len("file://"):] if path.startswith("file://") else path
        if "://" not in path:  # other schemes: read_bytes names them
            return os.path.expanduser(path)
    return read_bytes(item, kind)


def _open(av: Any, source: str | bytes, name: str, kind: str = "video") -> Any:
    """An input container of the file (MediaError naming it when it cannot be read or parsed)."""
    try:
        # "file:" makes FFmpeg read a path as a file, never as one of its protocols (pipe:, tcp:, concat:, ...)
        return av.open(io.BytesIO(source) if isinstance(source, bytes) else f"file:{source}", "r")
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        raise MediaError(f"{kind} {name}: cannot read ({exc.strerror})") from exc
    except av.error.FFmpegError as exc:
        raise MediaError(f"{kind} {name}: not a decodable {kind} file ({exc})") from exc


def _video_stream(container: Any, name: str) -> Any:
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["none"]
        raise MediaError(f"video {name}: the file has no video stream (streams: {', '.join(kinds)})")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"  # frame- and slice-threaded decoding
    return stream


def _stream_fps(stream: Any, name: str) -> float:
    """Frames per second: the average rate, else FFmpeg's guess, else frames / duration."""
    for rate in (stream.average_rate, stream.guessed_rate):
        if rate is not None and rate > 0:
            return float(rate)
    if stream.frames and stream.duration and stream.time_base:
        return stream.frames / float(stream.duration * stream.time_base)
    raise MediaError(f"video {name}: the video stream states no frame rate; store the video as "
                     "{'frames': [...], 'fps': <fps>} instead")


def _count_frames(container: Any, stream: Any) -> int:
    """Frames in the stream by demuxing (no decoding): one packet per frame for video codecs."""
    return sum(1 for packet in container.demux(stream) if packet.size)


def _frame_indices(total: int, fps: float, cfg: VideoConfig, name: str) -> list[int]:
    try:
        return sample_indices(total, num_sampled_frames(total, fps, cfg))
    except MediaError as exc:
        raise MediaError(f"video {name}: {exc}") from exc


def _decode_at(av: Any, source: str | bytes, name: str, indices: list[int]) -> tuple[list, int]:
    """RGB uint8 arrays [H, W, 3] of the frames at `indices` (sorted), decoded in order and
    stopping after the last, so only the kept frames are held; also how many were decoded."""
    wanted, last = set(indices), indices[-1]
    kept, decoded = [], 0
    with _open(av, source, name) as container:
        for decoded, frame in enumerate(container.decode(_video_stream(container, name)), start=1):
            if decoded - 1 in wanted:
                kept.append(frame.to_ndarray(format="rgb24"))
            if decoded - 1 == last:
                break
    return kept, decoded


def read_video_file(item: Any, cfg: VideoConfig) -> SampledFrames:
    """Decode the frames of a video file kept per `cfg` (see the module docstring)."""
    name = _name(item)
    av = import_av(name)
    source = _source(item, name)
    try:
        with _open(av, source, name) as container:
            stream = _video_stream(container, name)
            fps = _stream_fps(stream, name)
            total = stream.frames or _count_frames(container, stream)
        indices = _frame_indices(total, fps, cfg, name)
        frames, decoded = _decode_at(av, source, name, indices)
        if len(frames) < len(indices):  # the header over-counted: sample the frames that decode
            total = decoded
            indices = _frame_indices(total, fps, cfg, name)
            frames, _ = _decode_at(av, source, name, indices)
    except av.error.FFmpegError as exc:
        raise MediaError(f"video {name}: not a decodable video file ({exc})") from exc
    return SampledFrames(frames, indices, fps, total)


class VideoPipeline:
    """item -> ProcessedVideo, per `VideoConfig` (see the module docstring)."""

    def __init__(self, cfg: VideoConfig) -> None:
        self.cfg = cfg
        self.frame_cfg = cfg.frame_image_config()

    def process(self, item: Any) -> ProcessedVideo:
        import numpy as np
        import torch
        from PIL import Image

        sampled = sample_frames(item, self.cfg)
        indices, source_fps = sampled.indices, sampled.source_fps
        images = [to_pil(frame, kind=f"video frame {i}") for frame, i in zip(sampled.frames, indices)]
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
                              source_fps=source_fps, sampled_fps=len(indices) * source_fps / sampled.total_frames)


def check_video_file(item: Any) -> None:
    """MediaError unless `item` opens as a container with a video stream whose first frame decodes
    (the start-up check of `check.py`; cheap: one frame is decoded)."""
    name = _name(item)
    av = import_av(name)
    source = _source(item, name)
    try:
        frames, _ = _decode_at(av, source, name, [0])
    except av.error.FFmpegError as exc:
        raise MediaError(f"video {name}: not a decodable video file ({exc})") from exc
    if not frames:
        raise MediaError(f"video {name}: the video stream has no decodable frame")


def read_audio_track(item: Any, kind: str = "video") -> dict[str, Any] | None:
    """A file's first audio track as `{"array": float32 mono [T], "sampling_rate": rate}` (its own
    rate; the processor resamples), or None when the file has no audio stream: a video's track
    (`--use-audio-in-video`: relax.utils.multimodal.audio_in_video) or a compressed audio file
    (mp3, flac, ogg, m4a: `audio.py`). `kind` names the item in errors."""
    import numpy as np

    name = _name(item)
    av = import_av(name)
    source = _source(item, name, kind)
    try:
        with _open(av, source, name, kind) as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            rate = int(stream.rate or stream.codec_context.sample_rate)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            chunks = [out.to_ndarray().reshape(-1) for frame in container.decode(stream)
                      for out in resampler.resample(frame)]
            chunks += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    except av.error.FFmpegError as exc:
        raise MediaError(f"{kind} {name}: its audio does not decode ({exc})") from exc
    if not chunks:
        return None
    return {"array": np.concatenate(chunks).astype(np.float32), "sampling_rate": rate}
