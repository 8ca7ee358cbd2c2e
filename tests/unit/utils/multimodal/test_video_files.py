"""Video files decoded with PyAV: real mp4 / mkv files built here, sampled per the video flags.

Each test video has 60 frames of 64x48 at 30 fps (2 s), frame i a solid colour that encodes i
(red: i % 8, green: i // 8, in steps of 32), so the frames kept can be told apart after a lossy
codec and the resize. mp4 (mpeg4) states its frame count in the header; mkv (ffv1) does not, so
the pipeline counts by demuxing. Covered: the video flags, every source form, corrupt / missing /
audio-only files, the start-up check, PyAV missing, and a file in /generate's `video_data`.
"""

from __future__ import annotations

import base64
import http.server
import io
import re
import sys
import threading
import wave
from pathlib import Path

import av  # the `test` extra installs it
import numpy as np
import pytest

from relax.utils.multimodal import MediaError, VideoConfig, VideoPipeline
from relax.utils.multimodal.check import check_item, check_row_media
from relax.utils.multimodal.video import sample_indices

TOTAL, FPS, WIDTH, HEIGHT = 60, 30, 64, 48
SMALL = {"min_tokens": 4, "max_tokens": 4}  # frames stay 56x56: fast, and colours are what counts


def colour(i: int) -> tuple[int, int, int]:
    return (i % 8) * 32 + 16, (i // 8) * 32 + 16, 128


def frame_index(pixel) -> int:
    """The source frame a decoded pixel came from (the nearest colour step)."""
    r, g = int(pixel[0]), int(pixel[1])
    return round((r - 16) / 32) + 8 * round((g - 16) / 32)


def encode(container: str, codec: str, pix_fmt: str, path: Path | None = None, muxer: dict | None = None,
           **options: str) -> bytes:
    buf = io.BytesIO()
    with av.open(str(path) if path else buf, "w", format=container, options=muxer or {}) as out:
        stream = out.add_stream(codec, rate=FPS)
        stream.width, stream.height, stream.pix_fmt, stream.options = WIDTH, HEIGHT, pix_fmt, options
        for i in range(TOTAL):
            array = np.empty((HEIGHT, WIDTH, 3), dtype=np.uint8)
            array[...] = colour(i)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        out.mux(stream.encode())
    return path.read_bytes() if path else buf.getvalue()


@pytest.fixture(scope="module")
def mp4() -> bytes:
    return encode("mp4", "mpeg4", "yuv420p", qscale="1")


@pytest.fixture(scope="module")
def mkv() -> bytes:
    return encode("matroska", "ffv1", "bgr0")  # lossless; no frame count in the header


@pytest.fixture
def mp4_path(tmp_path, mp4) -> Path:
    path = tmp_path / "clip.mp4"
    path.write_bytes(mp4)
    return path


def kept_frames(result) -> list[int]:
    return [frame_index(result.frames[k, 28, 28]) for k in range(result.frames.shape[0])]


@pytest.mark.parametrize("flags, count", [
    ({}, 4),                                # 2 s at --video-fps 2
    ({"fps": 5.0}, 10),
    ({"fps": 1.0, "min_frames": 6}, 6),     # raised to --video-fps-min-frames
    ({"fps": 10.0, "max_frames": 9}, 8),    # capped by --video-fps-max-frames, floored to --frame-factor
    ({"fps": 60.0}, 60),                    # no more frames than there are
])
@pytest.mark.parametrize("fmt", ["mp4", "mkv"])
def test_frames_are_sampled_per_the_video_flags(request, tmp_path, fmt, flags, count):
    path = tmp_path / f"clip.{fmt}"
    path.write_bytes(request.getfixturevalue(fmt))
    result = VideoPipeline(VideoConfig(**SMALL, **flags)).process(str(path))
    assert result.indices == sample_indices(TOTAL, count)
    assert kept_frames(result) == result.indices  # the decoded frames are the sampled ones
    assert result.source_fps == pytest.approx(FPS)
    assert result.sampled_fps == pytest.approx(count / (TOTAL / FPS))
    assert tuple(result.frames.shape) == (count, 56, 56, 3)
    assert result.grid_thw == (count // 2, 4, 4)
    assert result.num_tokens == count // 2 * 4


def test_the_default_flags_keep_the_ends_and_two_frames_between(mp4_path):
    result = VideoPipeline(VideoConfig(**SMALL)).process(str(mp4_path))
    assert result.indices == [0, 20, 39, 59]
    assert kept_frames(result) == [0, 20, 39, 59]
    assert result.frame_times == pytest.approx([0, 20 / 30, 39 / 30, 59 / 30])


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_root(tmp_path):
    """(served folder, its base URL): a local HTTP server for the URL form."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Quiet(*a, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("form", ["path", "file_url", "bytes", "struct", "data_uri", "raw_base64", "http"])
def test_every_source_form_decodes_the_same(mp4, mp4_path, http_root, form):
    root, base_url = http_root
    (root / "served.mp4").write_bytes(mp4)
    b64 = base64.b64encode(mp4).decode("ascii")
    item = {"path": str(mp4_path), "file_url": f"file://{mp4_path}", "bytes": mp4,
            "struct": {"bytes": mp4, "path": "ignored.mp4"}, "data_uri": "data:video/mp4;base64," + b64,
            "raw_base64": b64, "http": f"{base_url}/served.mp4"}[form]
    result = VideoPipeline(VideoConfig(**SMALL)).process(item)
    assert kept_frames(result) == result.indices == [0, 20, 39, 59]


def test_a_path_is_a_file_never_an_ffmpeg_protocol(monkeypatch, tmp_path, mp4):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pipe:0").write_bytes(mp4)  # FFmpeg alone would read stdin
    assert VideoPipeline(VideoConfig(**SMALL)).process("pipe:0").indices == [0, 20, 39, 59]
    with pytest.raises(MediaError, match=re.escape("'concat:a.mp4|b.mp4': cannot read")):
        VideoPipeline(VideoConfig(**SMALL)).process("concat:a.mp4|b.mp4")


def test_a_missing_file_names_it(tmp_path):
    missing = tmp_path / "nowhere.mp4"
    with pytest.raises(MediaError, match=r"video '.*nowhere\.mp4': cannot read"):
        VideoPipeline(VideoConfig(**SMALL)).process(str(missing))


@pytest.mark.parametrize("content", [b"not a video at all" * 100, "truncated"])
def test_a_corrupt_file_names_it_and_says_what_is_wrong(tmp_path, mp4, content):
    path = tmp_path / "broken.mp4"
    path.write_bytes(mp4[: len(mp4) // 3] if content == "truncated" else content)
    with pytest.raises(MediaError, match=r"video '.*broken\.mp4': not a decodable video file"):
        VideoPipeline(VideoConfig(**SMALL)).process(str(path))


def test_a_truncated_file_whose_header_over_counts_samples_the_frames_that_decode(tmp_path):
    data = encode("mp4", "mpeg4", "yuv420p", path=tmp_path / "full.mp4", muxer={"movflags": "+faststart"},
                  qscale="1")  # the index (60 frames) before the frames, so a cut file still opens
    with av.open(io.BytesIO(data[: len(data) // 2])) as container:
        assert container.streams.video[0].frames == TOTAL
    result = VideoPipeline(VideoConfig(**SMALL)).process(data[: len(data) // 2])
    decoded = result.indices[-1] + 1
    assert 4 <= decoded < TOTAL
    assert result.indices == sample_indices(decoded, 4)
    assert result.sampled_fps == pytest.approx(4 * FPS / decoded)


def test_inline_payloads_are_not_printed_in_errors():
    junk = base64.b64encode(b"not a video at all" * 10).decode("ascii")
    with pytest.raises(MediaError, match=r"video <240 characters of base64>: not a decodable video file") as raised:
        VideoPipeline(VideoConfig(**SMALL)).process(junk)
    assert junk not in str(raised.value)
    with pytest.raises(MediaError, match=r"video <180 inline bytes>: not a decodable video file"):
        VideoPipeline(VideoConfig(**SMALL)).process(b"not a video at all" * 10)


def wav_bytes() -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
        out.writeframes(b"\0\0" * 1600)
    return buf.getvalue()


def test_a_file_without_a_video_stream_says_so(tmp_path):
    path = tmp_path / "speech.wav"
    path.write_bytes(wav_bytes())
    with pytest.raises(MediaError, match=r"'.*speech\.wav': the file has no video stream \(streams: audio\)"):
        VideoPipeline(VideoConfig(**SMALL)).process(str(path))


def test_the_startup_check_accepts_a_good_file_and_rejects_a_bad_one(tmp_path, mp4_path, mkv):
    check_item("video", str(mp4_path))
    check_item("video", mkv)
    (tmp_path / "broken.mp4").write_bytes(b"\0" * 256)
    (tmp_path / "speech.wav").write_bytes(wav_bytes())
    with pytest.raises(MediaError, match=r"column 'clips'.*broken\.mp4': not a decodable video file"):
        check_row_media({"clips": [str(mp4_path), str(tmp_path / "broken.mp4")]}, {"video": "clips"})
    with pytest.raises(MediaError, match="no video stream"):
        check_item("video", str(tmp_path / "speech.wav"))
    with pytest.raises(MediaError, match="cannot read"):
        check_item("video", str(tmp_path / "nowhere.mp4"))


def test_without_pyav_a_file_is_an_error_naming_it_and_the_fix(monkeypatch, mp4_path):
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` now raises ImportError
    for run in (lambda: VideoPipeline(VideoConfig(**SMALL)).process(str(mp4_path)),
                lambda: check_item("video", str(mp4_path))):
        with pytest.raises(MediaError, match=r"clip\.mp4'.*needs PyAV.*pip install av.*relax-rl\[video\]"):
            run()
    frames = [np.zeros((56, 56, 3), dtype=np.uint8)] * 4  # frame lists need no PyAV
    assert VideoPipeline(VideoConfig(**SMALL)).process(frames).indices == [0, 1, 2, 3]


def test_a_file_in_generate_video_data_becomes_the_video_tensors(tmp_path, mp4_path):
    from relax.utils.multimodal.processor import MultimodalProcessor
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer(["what moves here"] * 10, vocab_size=300)
    processor = MultimodalProcessor(build_tiny_vl("qwen2_5_vl", tokenizer, str(tmp_path / "vl")))
    tensors = processor.request_media_tensors(None, None, [str(mp4_path)])  # sampled at the default flags
    t, h, w = tensors["video_grid_thw"].tolist()[0]
    assert t == 2  # 4 frames (2 s at 2 fps), 2 per temporal patch
    assert tensors["pixel_values_videos"].shape[0] == t * h * w


def with_audio_track(path: Path, seconds: float = 2.0, rate: int = 16000, hz: float = 440.0) -> Path:
    """An mkv of the test frames (ffv1) and a sine tone (16-bit PCM), as a camera clip has both."""
    with av.open(str(path), "w", format="matroska") as out:
        video = out.add_stream("ffv1", rate=FPS)
        video.width, video.height, video.pix_fmt = WIDTH, HEIGHT, "bgr0"
        audio = out.add_stream("pcm_s16le", rate=rate)
        audio.layout = "mono"
        for i in range(TOTAL):
            array = np.empty((HEIGHT, WIDTH, 3), dtype=np.uint8)
            array[...] = colour(i)
            out.mux(video.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        out.mux(video.encode())
        samples = (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate) * 32767).astype(np.int16)
        for start in range(0, len(samples), 1600):
            frame = av.AudioFrame.from_ndarray(samples[None, start:start + 1600], format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            out.mux(audio.encode(frame))
        out.mux(audio.encode())
    return path


def test_the_audio_track_of_a_video_file(tmp_path, mp4_path):
    """--use-audio-in-video reads a file's own track (mono float32 at its rate); none: None."""
    from relax.utils.multimodal.video import read_audio_track

    path = with_audio_track(tmp_path / "camera.mkv")
    track = read_audio_track(str(path))
    assert track["sampling_rate"] == 16000 and track["array"].dtype == np.float32
    assert track["array"].shape == (32000,) and abs(float(np.abs(track["array"]).max()) - 0.5) < 1e-3
    assert read_audio_track(path.read_bytes())["array"].shape == (32000,)
    assert read_audio_track(str(mp4_path)) is None  # a silent file


@pytest.mark.parametrize("fmt, codec", [("flac", "flac"), ("mp3", "libmp3lame"), ("ogg", "libopus")])
def test_compressed_audio_files_decode(tmp_path, fmt, codec):
    """mp3 / flac / ogg audio items decode through PyAV and resample like WAV: a 440 Hz tone stays one."""
    from relax.utils.multimodal import AudioConfig, AudioPipeline
    from relax.utils.multimodal.check import check_item

    rate = 48000 if codec == "libopus" else 16000
    path = tmp_path / f"tone.{fmt}"
    with av.open(str(path), "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate) * 32767).astype(np.int16)
        for start in range(0, rate, 960):  # PyAV converts the frames to the encoder's format and frame size
            frame = av.AudioFrame.from_ndarray(tone[None, start:start + 960], format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    check_item("audio", str(path))
    out = AudioPipeline(AudioConfig(sample_rate=16000)).process(str(path))
    wave_ = out.waveform.numpy()
    assert out.sample_rate == 16000 and 0.9 * 16000 <= wave_.shape[0] <= 1.1 * 16000
    spectrum = np.abs(np.fft.rfft(wave_[2000:14000]))
    assert abs(np.argmax(spectrum) * 16000 / 12000 - 440) < 5  # still the tone (lossy codecs keep its pitch)
