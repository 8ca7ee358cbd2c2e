"""Audio pipeline: WAV decode, resampling to the processor's rate, max length, frame counts."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from relax.config.schema import DataConfig
from relax.utils.multimodal import AudioConfig, AudioPipeline, MediaError
from relax.utils.multimodal.audio import num_audio_tokens, resample


def tone(freq: float, seconds: float, rate: int) -> np.ndarray:
    return 0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)


def wav_bytes(samples: np.ndarray, rate: int, channels: int = 1) -> bytes:
    pcm = (np.repeat(samples[:, None], channels, axis=1) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("orig, new", [(44100, 16000), (8000, 16000), (22050, 16000)])
def test_resampled_tone_matches_the_ideal_tone(orig, new):
    out = resample(tone(440.0, 0.5, orig), orig, new)
    ideal = tone(440.0, 0.5, new)
    assert out.shape[0] == int(np.ceil(0.5 * orig * new / orig))
    inner = slice(64, -64)  # the edges see zero padding
    assert np.max(np.abs(out[inner] - ideal[: out.shape[0]][inner])) < 2e-3


def test_wav_is_resampled_to_the_sample_rate_flag_and_counted():
    result = AudioPipeline(AudioConfig(sample_rate=16000)).process(wav_bytes(tone(300.0, 1.0, 44100), 44100))
    assert result.sample_rate == 16000 and result.source_rate == 44100
    assert result.waveform.shape[0] == 16000
    assert result.feature_frames == 100  # 10 ms hops
    assert result.num_tokens == num_audio_tokens(100) == 25
    assert not result.truncated


def test_stereo_is_averaged_to_mono():
    result = AudioPipeline(AudioConfig()).process(wav_bytes(tone(300.0, 0.1, 16000), 16000, channels=2))
    assert result.waveform.ndim == 1 and result.waveform.shape[0] == 1600


def test_long_audio_is_cut_to_the_max_length():
    result = AudioPipeline(AudioConfig(max_seconds=0.5)).process({"array": tone(200.0, 2.0, 8000),
                                                                   "sampling_rate": 8000})
    assert result.truncated and result.waveform.shape[0] == 8000
    assert result.feature_frames == 50


def test_sample_rate_flag_changes_the_counts():
    item = {"array": tone(200.0, 1.0, 16000), "sampling_rate": 16000}
    assert AudioPipeline(AudioConfig(sample_rate=8000)).process(item).waveform.shape[0] == 8000
    assert AudioConfig.from_flags(DataConfig()).sample_rate == 16000


def test_corrupt_audio_is_a_media_error_naming_wav():
    with pytest.raises(MediaError, match="not a readable PCM WAV"):
        AudioPipeline(AudioConfig()).process(b"RIFF....garbage")


def test_missing_audio_file_names_the_path(tmp_path):
    with pytest.raises(MediaError, match="gone.wav.*cannot read"):
        AudioPipeline(AudioConfig()).process(str(tmp_path / "gone.wav"))
