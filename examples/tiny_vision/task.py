"""The CPU vision task: "which cell is red?" on a 2x2 grid image.

Each image is 56x56 pixels: four 28x28 cells, one red, the others other colours, with pixel
noise. A Qwen2.5-VL patch is 14 pixels and 2x2 patches merge into one LLM token, so each cell is
exactly one image token: the answer is in the picture, nowhere in the text (every prompt reads
the same). Cells are numbered 1 2 / 3 4; the response is `\\boxed{k}` and the built-in math
reward checks it against the label `k`. Chance is 0.25.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

CELL = 28
OTHER_COLOURS = [(40, 170, 60), (40, 80, 200), (220, 200, 40), (128, 128, 128), (150, 60, 170)]
RED = (215, 30, 30)
QUESTION = "<image>Which cell is red? The cells are 1 2 on top and 3 4 below. Answer with \\boxed{n}."


def make_image(red_cell: int, rng: random.Random) -> Any:
    """A PIL image with the red cell at `red_cell` (1..4)."""
    import numpy as np
    from PIL import Image

    noise = np.random.default_rng(rng.randrange(2 ** 32))
    pixels = np.zeros((2 * CELL, 2 * CELL, 3), dtype=np.int16)
    others = rng.sample(OTHER_COLOURS, 3)
    for cell in range(1, 5):
        colour = RED if cell == red_cell else others.pop()
        r, c = divmod(cell - 1, 2)
        pixels[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL] = colour
    pixels += noise.integers(-25, 26, size=pixels.shape, dtype=np.int16)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def data_uri(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def make_row(red_cell: int, rng: random.Random) -> dict[str, Any]:
    """One Relax row: a message with the `<image>` placeholder, the image (inline PNG), the label."""
    return {"prompt": [{"role": "user", "content": QUESTION}], "image": [data_uri(make_image(red_cell, rng))],
            "label": str(red_cell)}


def make_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [make_row(rng.randint(1, 4), rng) for _ in range(n)]


def response_text(label: str) -> str:
    return f"\\boxed{{{label}}}"


def tokenizer_corpus() -> list[str]:
    return [QUESTION.replace("<image>", "")] * 20 + [response_text(str(k)) for k in range(1, 5)] * 20
