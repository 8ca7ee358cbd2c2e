"""The audio side of the multimodal processor (tiny Qwen3-Omni thinker checkpoint): an `<audio>`
placeholder expands to the model's own pad count for the audio's length at --audio-sample-rate,
the request carries the exact samples, the engine side checks the count, and rows with different
frame counts collate into one padded batch."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import torch

from relax.utils.multimodal import AudioConfig, MediaError
from relax.utils.multimodal.processor import MultimodalProcessor
from relax.utils.multimodal.tensors import collate


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_omni

    tokenizer = train_chatml_tokenizer(["is the second tone higher?"] * 10, vocab_size=280)
    return build_tiny_omni(tokenizer, str(tmp_path_factory.mktemp("omni")), num_layers=1, encoder_depth=1)


def tone(seconds: float, rate: int) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * 300.0 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def pcm_wav(samples: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def pads(processor: MultimodalProcessor, item) -> int:
    encoded = processor.encode("<audio>higher?", {"audio": [item]})
    return encoded.input_ids.count(processor.audio_token_id)


# Qwen3-Omni's rule on 10 ms feature frames: 13 tokens per full 100-frame window, and the rest
# through three stride-2 convolutions: 50 frames -> 25 -> 13 -> 7.
@pytest.mark.parametrize("seconds, rate, tokens", [(1.0, 16000, 13), (0.5, 16000, 7), (2.5, 16000, 33),
                                                   (1.0, 8000, 13), (0.5, 8000, 7)])
def test_audio_pad_count_follows_the_sample_rate_flag_and_the_length(omni_dir, seconds, rate, tokens):
    processor = MultimodalProcessor(omni_dir, audio=AudioConfig(sample_rate=rate))
    assert pads(processor, tone(seconds, rate)) == tokens


def test_a_bare_waveform_is_read_at_the_sample_rate_flag(omni_dir):
    """16000 samples are 1 s at 16 kHz but 2 s at 8 kHz: twice the frames, twice the tokens."""
    samples = tone(1.0, 16000)
    assert pads(MultimodalProcessor(omni_dir, audio=AudioConfig(sample_rate=16000)), samples) == 13
    assert pads(MultimodalProcessor(omni_dir, audio=AudioConfig(sample_rate=8000)), samples) == 26


def test_a_wav_counts_by_its_duration_whatever_its_rate(omni_dir):
    processor = MultimodalProcessor(omni_dir)
    assert pads(processor, pcm_wav(tone(1.0, 44100), 44100)) == pads(processor, pcm_wav(tone(1.0, 8000), 8000)) == 13


def test_the_request_carries_the_exact_samples_and_the_engine_checks_the_count(omni_dir):
    processor = MultimodalProcessor(omni_dir)
    samples = tone(0.8, 16000) + np.float32(1e-7)  # not representable in 16-bit PCM
    encoded = processor.encode("<audio>a<audio>b", {"audio": [samples, tone(1.3, 16000)]})
    (first, second) = encoded.request["audio_data"]
    assert first.startswith("data:audio/wav;base64,")
    assert np.array_equal(processor.waveform(first, AudioConfig()).numpy(), samples)
    tensors = processor.request_tensors(encoded.input_ids, None, encoded.request["audio_data"])
    assert all(torch.equal(tensors[k], encoded.tensors[k]) for k in encoded.tensors)
    assert tensors["input_features"].shape[0] == 2 and tensors["feature_attention_mask"].sum(-1).tolist() == [80, 130]
    with pytest.raises(MediaError, match="audio pad token"):
        processor.request_tensors(encoded.input_ids, None, [second])


def test_placeholder_count_mismatch_and_too_short_audio_are_clear_errors(omni_dir):
    processor = MultimodalProcessor(omni_dir)
    with pytest.raises(MediaError, match="1 <audio> placeholder.*2 audio"):
        processor.encode("<audio>?", {"audio": [tone(0.5, 16000)] * 2})
    with pytest.raises(MediaError, match="shorter than one feature window"):
        processor.encode("<audio>?", {"audio": [tone(0.01, 16000)]})


def test_collate_pads_audio_frames_and_masks_them(omni_dir):
    processor = MultimodalProcessor(omni_dir)
    short, long = (processor.audio_tensors([tone(s, 16000)]) for s in (0.5, 1.2))
    batch = collate([short, None, long])
    assert batch["input_features"].shape == (2, 128, 120)
    assert batch["feature_attention_mask"].sum(-1).tolist() == [50, 120]
    assert torch.equal(batch["input_features"][0, :, :50], short["input_features"][0])
