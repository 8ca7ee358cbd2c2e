"""The CPU audio task: "is the second tone higher?", answered by number.

Each clip is two pure tones of 0.35 s at 16 kHz with 0.1 s of silence between them, plus a little
noise, their frequencies drawn from 250-1000 Hz (log-uniform) at least a factor 1.3 apart. The
Qwen3-Omni thinker hears a clip as 80 feature frames, 10 audio tokens. Every prompt reads the
same: the answer is only in the audio. The response is `\\boxed{1}` (yes, the second tone is
higher) or `\\boxed{2}` (no), and the built-in math reward checks it against the label. Chance is 0.5.
"""

from __future__ import annotations

import base64
import io
import math
import random
import wave
from typing import Any

RATE = 16000
TONE_S, GAP_S = 0.35, 0.1
QUESTION = "<audio>Is the second tone higher than the first? Answer \\boxed{1} for yes or \\boxed{2} for no."


def make_clip(first_hz: float, second_hz: float, rng: random.Random) -> Any:
    """float32 [T] mono at RATE: tone, silence, tone, with noise."""
    import numpy as np

    t = np.arange(int(TONE_S * RATE)) / RATE
    ramp = np.minimum(1.0, np.minimum(t, TONE_S - t) / 0.02)  # 20 ms fades: no clicks
    tones = [0.5 * ramp * np.sin(2 * np.pi * hz * t + rng.uniform(0, 2 * np.pi)) for hz in (first_hz, second_hz)]
    clip = np.concatenate([tones[0], np.zeros(int(GAP_S * RATE)), tones[1]])
    clip += np.random.default_rng(rng.randrange(2 ** 32)).normal(0.0, 0.02, clip.shape)
    return clip.astype(np.float32)


def wav_data_uri(clip: Any) -> str:
    """A 16-bit PCM WAV data URI (the row's form; the rollout re-sends it to the engine as float WAV)."""
    import numpy as np

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def make_row(rng: random.Random) -> dict[str, Any]:
    """One Relax row: a message with the `<audio>` placeholder, the clip (inline WAV), the label."""
    low = math.exp(rng.uniform(math.log(250), math.log(1000 / 1.3)))
    high = low * math.exp(rng.uniform(math.log(1.3), math.log(1000 / low)))
    higher = rng.random() < 0.5
    first, second = (low, high) if higher else (high, low)
    clip = make_clip(first, second, rng)
    return {"prompt": [{"role": "user", "content": QUESTION}], "audio": [wav_data_uri(clip)],
            "label": "1" if higher else "2"}


def make_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [make_row(rng) for _ in range(n)]


def response_text(label: str) -> str:
    return f"\\boxed{{{label}}}"


def tokenizer_corpus() -> list[str]:
    return [QUESTION.replace("<audio>", "")] * 20 + [response_text(k) for k in "12"] * 20
