"""The streaming loader with media pipelines: media processed per the flags, bad rows per --skip-malformed-rows."""

from __future__ import annotations

import io
import json
import wave

import numpy as np
import pytest
from PIL import Image

from relax.utils.data import DataError, StreamingPromptDataset
from relax.utils.multimodal import AudioConfig, AudioPipeline, ImageConfig, ImagePipeline


def write_rows(tmp_path, rows):
    path = tmp_path / "mm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def wav_file(path, seconds=0.5, rate=22050):
    pcm = (0.3 * np.sin(2 * np.pi * 330 * np.arange(int(seconds * rate)) / rate) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return str(path)


def png_file(path, size=(100, 60)):
    buf = io.BytesIO()
    Image.new("RGB", size, (0, 200, 0)).save(buf, format="PNG")
    path.write_bytes(buf.getvalue())
    return str(path)


def omni_rows(tmp_path):
    (tmp_path / "broken.wav").write_bytes(b"RIFF, but not a wav")
    return [
        {"input": "<image><audio> q0", "label": "0", "img": [png_file(tmp_path / "a.png")],
         "aud": [wav_file(tmp_path / "a.wav")]},
        {"input": "<image><audio> q1", "label": "1", "img": [png_file(tmp_path / "b.png")],
         "aud": [str(tmp_path / "broken.wav")]},
        {"input": "<image><audio> q2", "label": "2", "img": [str(tmp_path / "gone.png")],
         "aud": [wav_file(tmp_path / "c.wav")]},
        {"input": "<image><audio> q3", "label": "3", "img": [png_file(tmp_path / "d.png")],
         "aud": [wav_file(tmp_path / "d.wav", rate=8000)]},
    ]


def dataset(path, **kwargs):
    pipelines = {"image": ImagePipeline(ImageConfig(max_tokens=4)), "audio": AudioPipeline(AudioConfig())}
    return StreamingPromptDataset(path, label_key="label", multimodal_keys={"image": "img", "audio": "aud"},
                                  media_pipelines=pipelines, prefetch_chunk_size=2, **kwargs)


def test_media_are_processed_per_the_flags_and_bad_rows_are_skipped_and_counted(tmp_path):
    data = dataset(write_rows(tmp_path, omni_rows(tmp_path)), skip_malformed=True)
    samples = data.take(2)
    data.close()
    assert [s.label for s in samples] == ["0", "3"] and data.num_skipped == 2
    image, audio = samples[0].multimodal_inputs["image"][0], samples[0].multimodal_inputs["audio"][0]
    assert tuple(image.shape) == (28, 56, 3)  # 60x100 within --image-max-token-num=4 (1x2 tokens of 28 px)
    assert audio.ndim == 1 and audio.shape[0] == 8000  # 0.5 s resampled from 22.05 kHz to 16 kHz


@pytest.mark.parametrize("bad_row, needle", [(1, r"column 'aud'.*broken.wav.*not a readable PCM WAV"),
                                             (2, r"column 'img'.*gone.png.*cannot read")])
def test_a_corrupt_or_missing_file_fails_the_run_naming_the_row_and_the_file(tmp_path, bad_row, needle):
    rows = omni_rows(tmp_path)
    good = [r for i, r in enumerate(rows) if i not in (1, 2)]
    path = write_rows(tmp_path, good[:1] + [rows[bad_row]] + good[1:])
    data = dataset(path)
    with pytest.raises(DataError, match=r"mm.jsonl \(line 2\).*" + needle + ".*--skip-malformed-rows"):
        data.take(3)
    data.close()


def test_the_run_flags_resize_images_in_the_streaming_loader(tmp_path):
    from relax.config.schema import RelaxConfig
    from relax.engine.rollout.data_source import build_prompt_dataset
    from relax.engine.specs import DataSpec

    image_path = png_file(tmp_path / "a.png", (448, 448))
    path = write_rows(tmp_path, [{"input": "<image> q", "label": "0", "img": [image_path]}])
    args = RelaxConfig().replace(prompt_data=path, label_key="label", multimodal_keys={"image": "img"},
                                 use_streaming_dataset=True, image_max_token_num=16).args
    data = build_prompt_dataset(DataSpec.from_args(args), tokenizer=None)
    image = data.take(1)[0].multimodal_inputs["image"][0]
    data.close()
    assert tuple(image.shape) == (112, 112, 3)  # 16 tokens of 28x28 pixels


def test_the_in_memory_dataset_checks_media_and_skips_or_fails_bad_rows(tmp_path):
    from relax.utils.data import PromptDataset

    path = write_rows(tmp_path, omni_rows(tmp_path))
    kwargs = dict(label_key="label", multimodal_keys={"image": "img", "audio": "aud"}, check_media=True)
    with pytest.raises(DataError, match=r"mm.jsonl \(line 2\).*column 'aud'.*broken.wav.*not a readable WAV"):
        PromptDataset(path, **kwargs)
    data = PromptDataset(path, skip_malformed=True, **kwargs)
    assert [s.label for s in data] == ["0", "3"] and data.num_skipped == 2
    assert "gone.png" in data.skip_reasons[1] and "cannot read" in data.skip_reasons[1]
    assert data[0].multimodal_inputs["image"] == [str(tmp_path / "a.png")]  # references kept as they are
