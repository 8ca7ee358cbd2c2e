"""The CPU vision task: "which colour is the picture?", answered by number.

Each image is 56x56 pixels of one of four colours (1 red, 2 green, 3 blue, 4 yellow) with strong
pixel noise; a Qwen2.5-VL sees it as 2x2 merged patches, 4 image tokens. Every prompt reads the
same: the answer is only in the pixels. The response is `\\boxed{k}` and the built-in math reward
checks it against the label `k`. Chance is 0.25.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

SIZE = 56
COLOURS = {1: (210, 40, 40), 2: (40, 170, 60), 3: (40, 80, 210), 4: (220, 200, 40)}
QUESTION = "<image>Which colour is the picture: 1 red, 2 green, 3 blue or 4 yellow? Answer with \\boxed{n}."


def make_image(colour: int, rng: random.Random) -> Any:
    """A PIL image of colour `colour` (1..4) with noise."""
    import numpy as np
    from PIL import Image

    noise = np.random.default_rng(rng.randrange(2 ** 32))
    pixels = np.zeros((SIZE, SIZE, 3), dtype=np.int16) + np.array(COLOURS[colour], dtype=np.int16)
    pixels += noise.integers(-60, 61, size=pixels.shape, dtype=np.int16)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def data_uri(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def make_row(colour: int, rng: random.Random) -> dict[str, Any]:
    """One Relax row: a message with the `<image>` placeholder, the image (inline PNG), the label."""
    return {"prompt": [{"role": "user", "content": QUESTION}], "image": [data_uri(make_image(colour, rng))],
            "label": str(colour)}


def make_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [make_row(rng.randint(1, 4), rng) for _ in range(n)]


def response_text(label: str) -> str:
    return f"\\boxed{{{label}}}"


def tokenizer_corpus() -> list[str]:
    return [QUESTION.replace("<image>", "")] * 20 + [response_text(str(k)) for k in range(1, 5)] * 20
