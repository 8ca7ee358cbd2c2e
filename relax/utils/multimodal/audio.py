"""Audio pipeline: a media item -> mono waveform at the processor's rate, cut to the max length -> frames, tokens.

Steps:
1. decode: a PCM WAV file (8/16/32-bit integer, via the standard library's `wave`; or 32-bit IEEE
   float, the exact form `float_wav` writes for /generate's `audio_data`), an HF
   datasets audio struct `{"array": [...], "sampling_rate": sr}`, or a bare array/tensor [T]
   or [T, C] taken to be at the target rate already; channels are averaged to mono;
2. resample to `--audio-sample-rate` (Whisper-family processors expect 16 kHz) with a
   band-limited (windowed-sinc, Hann window, 16 zero crossings) interpolator in numpy:
   torchaudio is not a dependency, and for tones and speech this is within ~1e-3 of an ideal
   resampler away from the edges;
3. keep at most `max_seconds` (30 s: one Whisper chunk; the rest is cut, `truncated=True`);
4. feature frames = samples // hop_length (10 ms hops of the log-mel extractor, its valid frames
   per the attention mask); audio tokens after the encoder's stride-2 conv and stride-2 pooling
   (Qwen2-Audio / Qwen2.5-Omni `_get_feat_extract_output_lengths`):
   t1 = (frames - 1) // 2 + 1, tokens = (t1 - 2) // 2 + 1.
Compressed formats (mp3, flac, ogg, m4a, ...) decode with PyAV (FFmpeg's binding, the optional
`video` extra that video files use too); without it they are a `MediaError` saying how to install it.
"""

from __future__ import annotations

import io
import math
import struct
import wave
from dataclasses import dataclass
from typing import Any

from relax.utils.multimodal.config import AudioConfig
from relax.utils.multimodal.sources import MediaError, describe, read_bytes

_ZERO_CROSSINGS = 16   # half-width of the sinc kernel, in zero crossings of the filter
_CHUNK = 8192          # output samples computed per block (bounds the [chunk, taps] matrix)


def resample(waveform_T: Any, orig_rate: int, new_rate: int) -> Any:
    """float64 numpy [T] at `orig_rate` -> [ceil(T * new / orig)] at `new_rate` (band-limited)."""
    import numpy as np

    x = np.asarray(waveform_T, dtype=np.float64)
    if orig_rate == new_rate or x.size == 0:
        return x
    g = math.gcd(orig_rate, new_rate)
    up, down = new_rate // g, orig_rate // g
    cutoff = min(1.0, up / down)                  # of the input's Nyquist: low-pass before decimating
    half_width = _ZERO_CROSSINGS / cutoff         # kernel half-width in input samples
    n_out = -(-x.size * up // down)
    offsets = np.arange(-math.floor(half_width), math.ceil(half_width) + 1)  # [K]
    out = np.empty(n_out)
    for start in range(0, n_out, _CHUNK):
        t = np.arange(start, min(start + _CHUNK, n_out)) * down / up     # [N] input positions
        idx = np.floor(t).astype(np.int64)[:, None] + offsets            # [N, K]
        dist = t[:, None] - idx                                          # [N, K]
        window = np.where(np.abs(dist) <= half_width, 0.5 * (1 + np.cos(np.pi * dist / half_width)), 0.0)
        kernel = cutoff * np.sinc(cutoff * dist) * window                # [N, K]
        valid = (idx >= 0) & (idx < x.size)
        out[start:start + t.size] = (kernel * np.where(valid, x[np.clip(idx, 0, x.size - 1)], 0.0)).sum(axis=1)
    return out


def float_wav(waveform_T: Any, rate: int) -> bytes:
    """A mono float waveform [T] as 32-bit IEEE-float WAV bytes (format tag 3): lossless for
    float32 samples, unlike 16-bit PCM, so an engine decodes exactly what the rollout processed."""
    import numpy as np

    data = np.asarray(waveform_T, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)


def _float_wav(data: bytes) -> tuple[Any, int] | None:
    """(float64 [T] mono, rate) of a 32-bit IEEE-float WAV; None for any other WAV (the `wave`
    module reads PCM only)."""
    import numpy as np

    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos, fmt, samples = 12, None, None
    while pos + 8 <= len(data):
        tag, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        body = data[pos + 8:pos + 8 + size]
        if tag == b"fmt ":
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif tag == b"data":
            samples = body
        pos += 8 + size + (size & 1)
    if fmt is None or samples is None or fmt[0] != 3 or fmt[5] != 32:
        return None
    channels, rate = fmt[1], fmt[2]
    array = np.frombuffer(samples[:len(samples) // (4 * channels) * 4 * channels], dtype="<f4").astype(np.float64)
    return array.reshape(-1, channels).mean(axis=1), rate


def decode_wav(data: bytes, item: Any) -> tuple[Any, int]:
    """PCM or 32-bit float WAV bytes -> (float64 numpy [T] mono in [-1, 1], sample rate)."""
    import numpy as np

    floats = _float_wav(data)
    if floats is not None:
        return floats
    if not data.startswith(b"RIFF"):
        return decode_compressed(data, item)
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise MediaError(f"audio {describe(item)}: not a readable PCM WAV file ({exc})") from exc
    dtypes = {1: np.uint8, 2: np.int16, 4: np.int32}
    if width not in dtypes:
        raise MediaError(f"audio {describe(item)}: {8 * width}-bit WAV is not supported (8, 16 or 32-bit PCM)")
    samples = np.frombuffer(raw, dtype=dtypes[width]).astype(np.float64)
    if width == 1:
        samples = samples - 128.0
    samples /= float(2 ** (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1), rate


def decode_compressed(data: bytes, item: Any) -> tuple[Any, int]:
    """mp3 / flac / ogg / m4a bytes -> (float64 numpy [T] mono, sample rate), through PyAV."""
    from relax.utils.multimodal.video import read_audio_track

    try:
        import av  # noqa: F401 - only to say what to install
    except ImportError as exc:
        raise MediaError(f"audio {describe(item)}: not a PCM WAV file; compressed formats (mp3, flac, ogg) decode "
                         "with PyAV, which is not installed: `pip install av` (or `pip install 'relax-rl[video]'`), "
                         "or convert to WAV") from exc
    track = read_audio_track(data, kind="audio")
    if track is None:
        raise MediaError(f"audio {describe(item)}: the file has no audio stream")
    return track["array"].astype("float64"), track["sampling_rate"]


def _waveform(item: Any, cfg: AudioConfig) -> tuple[Any, int]:
    import numpy as np

    if isinstance(item, dict) and item.get("array") is not None:
        rate = item.get("sampling_rate")
        if not rate or rate <= 0:
            raise MediaError("audio {'array': ...}: needs a positive 'sampling_rate'")
        array, rate = item["array"], int(rate)
    elif hasattr(item, "shape"):
        array, rate = item, cfg.sample_rate
    else:
        return decode_wav(read_bytes(item, "audio"), item)
    array = np.asarray(array.numpy() if hasattr(array, "numpy") else array, dtype=np.float64)
    if array.ndim == 2:
        array = array.mean(axis=1)  # [T, C] -> [T]
    if array.ndim != 1:
        raise MediaError(f"audio array: expected shape [T] or [T, C], got {list(array.shape)}")
    return array, rate


def num_feature_frames(num_samples: int, cfg: AudioConfig) -> int:
    return num_samples // cfg.hop_length


def num_audio_tokens(feature_frames: int) -> int:
    if feature_frames < 1:
        return 0
    after_conv = (feature_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


@dataclass(frozen=True)
class ProcessedAudio:
    waveform: Any          # float32 tensor [T], mono, at `sample_rate`
    sample_rate: int
    source_rate: int
    truncated: bool        # longer than max_seconds and cut
    feature_frames: int
    num_tokens: int


class AudioPipeline:
    """item -> ProcessedAudio, per `AudioConfig` (see the module docstring)."""

    def __init__(self, cfg: AudioConfig) -> None:
        self.cfg = cfg

    def process(self, item: Any) -> ProcessedAudio:
        import torch

        samples, rate = _waveform(item, self.cfg)
        samples = resample(samples, rate, self.cfg.sample_rate)
        truncated = samples.shape[0] > self.cfg.max_samples
        samples = samples[:self.cfg.max_samples]
        frames = num_feature_frames(samples.shape[0], self.cfg)
        return ProcessedAudio(waveform=torch.from_numpy(samples.astype("float32")), sample_rate=self.cfg.sample_rate,
                              source_rate=rate, truncated=truncated, feature_frames=frames,
                              num_tokens=num_audio_tokens(frames))
