"""The agentic examples' tasks and environments (examples/tiny_agent, examples/deepeyes): the answer
needs the tool, the tools answer as the rollout expects, and the SFT demonstrations are the
rollout's own token sequences."""

from __future__ import annotations

import random

import numpy as np
import pytest

from examples.deepeyes import env_deepeyes
from examples.deepeyes import task as eyes
from examples.tiny_agent import env_lookup
from examples.tiny_agent import task as shop
from relax.types import Sample


def test_the_lookup_tool_reads_the_rows_own_price_list():
    row = shop.make_rows(1, seed=3)[0]
    item, price = row["metadata"]["item"], row["label"]
    assert row["metadata"]["prices"][item] == price and price not in row["prompt"][1]["content"].split()
    env = env_lookup.build_env(sample=Sample(metadata=row["metadata"]))
    obs, done, info = env.step(shop.tool_call(item) + "<|im_end|>")
    assert (obs, done, info) == ({"obs_str": f"{item}: {price}", "role": "tool"}, False, {"tool_call": True})
    assert env.step("<tool_call>\n{not json}\n</tool_call>")[0]["obs_str"].startswith("error")
    assert env.step(shop.answer(price)) == (None, True, {"tool_call": False})


def test_the_zoom_tool_shows_a_colour_the_thumbnail_hides():
    """At the 4-token view (56x56) every region is grey; the zoomed region keeps its checkerboard."""
    from PIL import Image

    image = eyes.make_image({"alpha": 1, "beta": 2, "gamma": 3, "delta": 4}, random.Random(0))
    thumb = np.asarray(image.resize((56, 56), Image.Resampling.BICUBIC), dtype=np.float32)
    means = [thumb[y // 2:y // 2 + 28, x // 2:x // 2 + 28].mean(axis=(0, 1)) for x, y in eyes.REGIONS.values()]
    assert np.abs(np.array(means) - 128).max() < 3  # no colour left at the prompt's size
    env = env_deepeyes.build_env(sample=Sample(multimodal_inputs={"image": [eyes.data_uri(image)]}))
    obs, done, info = env.step(eyes.tool_call("gamma"))
    crop = np.asarray(obs["multi_modal_data"]["image"][0], dtype=np.float32)
    assert obs["obs_str"] == "<image>" and not done and info["region"] == "gamma" and crop.shape == (56, 56, 3)
    even = crop[::2, ::2].mean(axis=(0, 1))  # the (x + y) even cells hold the colour itself: blue
    assert even[2] > 150 and even[0] < 90 and even[1] < 90
    assert "error" in env.step(eyes.tool_call("omega"))[0]["obs_str"]


def test_sft_demonstrations_are_the_rollouts_token_sequences():
    from examples.tiny_agent.prepare import PrepareSettings, demo
    from relax.engine.agentic.observation import ObservationEncoder
    from relax.utils.tiny_model import train_chatml_tokenizer

    tok = train_chatml_tokenizer(shop.tokenizer_corpus(n=40), vocab_size=300, tool_template=True)
    row = shop.make_rows(1, seed=1)[0]
    d = demo(tok, ObservationEncoder(tok), row, random.Random(0), PrepareSettings(tool_frac=1.0))
    text = tok.decode(d.ids)
    item, price = row["metadata"]["item"], row["label"]
    assert text.endswith(shop.tool_call(item) + "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
                         f"{item}: {price}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                         + shop.answer(price) + "<|im_end|>")
    trained = tok.decode([t for t, m in zip(d.ids, d.trained) if m])
    assert trained == shop.tool_call(item) + "<|im_end|>" + shop.answer(price) + "<|im_end|>"


@pytest.mark.parametrize("frac", [0.0, 1.0])
def test_the_demonstration_mix_follows_tool_frac(frac):
    from examples.tiny_agent.prepare import PrepareSettings, demo
    from relax.engine.agentic.observation import ObservationEncoder
    from relax.utils.tiny_model import train_chatml_tokenizer

    tok = train_chatml_tokenizer(shop.tokenizer_corpus(n=40), vocab_size=300, tool_template=True)
    rng = random.Random(0)
    texts = [tok.decode(demo(tok, ObservationEncoder(tok), row, rng, PrepareSettings(tool_frac=frac)).ids)
             for row in shop.make_rows(10, seed=2)]
    assert all(("<tool_call>" in t) == (frac == 1.0) for t in texts)
