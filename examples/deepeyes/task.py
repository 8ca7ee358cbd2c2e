"""The tiny DeepEyes task: a colour that only a zoom tool shows.

The prompt image (112x112) has four regions (alpha top-left, beta top-right, gamma bottom-left, delta
bottom-right),
each a one-pixel checkerboard of a colour C and its mirror about grey, 2*128 - C (1 red, 2 green,
3 blue, 4 white), with noise. The model's processor shows the whole image at 4 vision tokens
(56x56): the downscale averages each checkerboard to grey, so at that size every region looks the
same. The `zoom` tool returns one region at full resolution (56x56, 4 tokens, no downscale), where
the checkerboard, and so the colour, is plain:

    user       <image>Which colour is region gamma: 1 red, 2 green, 3 blue or 4 white? Answer with \\boxed{n}.
    assistant  <tool_call>\\n{"name": "zoom", "arguments": {"region": "gamma"}}\\n</tool_call>
    tool       <image> (region gamma, zoomed)
    assistant  It is \\boxed{2}.                              (label "2"; the built-in math reward)

Without the tool the answer is a guess (1 in 4). As in DeepEyes, the observation is an image cut
from the prompt's own image; the tool call is Qwen's format (Qwen2.5's chat template).
"""

from __future__ import annotations

import base64
import io
import json
import random
from typing import Any

SIZE, HALF = 112, 56
COLOURS = {1: (200, 40, 40), 2: (40, 180, 40), 3: (40, 40, 200), 4: (220, 220, 220)}
REGIONS = {"alpha": (0, 0), "beta": (HALF, 0), "gamma": (0, HALF), "delta": (HALF, HALF)}  # -> (left, top)
QUESTION = "<image>Which colour is region {k}: 1 red, 2 green, 3 blue or 4 white? Answer with \\boxed{{n}}."
SYSTEM = "You are a careful observer. Call zoom to see a region up close."


def region_pixels(colour: int, rng: random.Random) -> Any:
    """A HALF x HALF checkerboard of the colour and its mirror about grey, with noise (uint8)."""
    import numpy as np

    c = np.array(COLOURS[colour], dtype=np.int16)
    yy, xx = np.mgrid[0:HALF, 0:HALF]
    board = np.where(((xx + yy) % 2 == 0)[..., None], c, 256 - c)
    noise = np.random.default_rng(rng.randrange(2 ** 32)).integers(-20, 21, size=board.shape, dtype=np.int16)
    return (board + noise).clip(0, 255).astype(np.uint8)


def make_image(colours: dict[str, int], rng: random.Random) -> Any:
    import numpy as np
    from PIL import Image

    pixels = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
    for region, (left, top) in REGIONS.items():
        pixels[top:top + HALF, left:left + HALF] = region_pixels(colours[region], rng)
    return Image.fromarray(pixels)


def zoom(image: Any, region: str) -> Any:
    """Region `region` of the image at full resolution."""
    left, top = REGIONS[region]
    return image.crop((left, top, left + HALF, top + HALF))


def data_uri(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def from_data_uri(uri: str) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")


def tool_call(region: str) -> str:
    return '<tool_call>\n{"name": "zoom", "arguments": ' + json.dumps({"region": region}) + "}\n</tool_call>"


def answer(colour: str) -> str:
    return f"It is \\boxed{{{colour}}}."


def guess(colour: str) -> str:
    return f"I guess \\boxed{{{colour}}}."


def make_row(rng: random.Random) -> dict[str, Any]:
    colours = {region: rng.randint(1, 4) for region in REGIONS}
    k = rng.choice(list(REGIONS))
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION.format(k=k)}],
            "image": [data_uri(make_image(colours, rng))], "metadata": {"region": k}, "label": str(colours[k])}


def make_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [make_row(rng) for _ in range(n)]


def tokenizer_corpus(repeat: int = 50) -> list[str]:
    """The task's text (questions, tool calls, answers) with ChatML role names, repeated so that BPE
    merges its words (each region name becomes one token)."""
    texts = ["system\n" + SYSTEM] * repeat
    for colour, region in enumerate(REGIONS, start=1):
        texts += [QUESTION.format(k=region).replace("<image>", "user\n"), tool_call(region), answer(str(colour)),
                  guess(str(colour))] * repeat
    return texts
