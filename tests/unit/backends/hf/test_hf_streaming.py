"""Streamed replies (streaming.py): the text an unfinished row may show, and SGLang's incremental
events (`--incremental-streaming-output`) adding up to the unstreamed reply, on an in-process engine."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from relax.backends.hf.protocol import GenerateRequest, normalize_generate
from relax.backends.hf.sampling import parse_sampling_params
from relax.backends.hf.streaming import Progress, generate_events, visible_text


def test_visible_text_holds_back_what_the_end_may_remove(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    ids = tokenizer.encode("the cat sat on", add_special_tokens=False)
    assert visible_text(tokenizer, ids, parse_sampling_params({})) == "the cat sat on"
    assert visible_text(tokenizer, ids, parse_sampling_params({"stop": ["on the"]})) == "the cat s"  # 5 held
    assert visible_text(tokenizer, ids, parse_sampling_params({"stop_token_ids": [9]})) == "the cat sat"
    progress = Progress()
    assert progress.delta("the") == "the" and progress.delta("the cat") == " cat" and progress.delta("the") == ""


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from relax.backends.hf.engine import HFEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield HFEngine(str(tiny_model_dir), seed=0)
    torch.set_num_threads(threads)


def test_incremental_events_add_up_to_the_unstreamed_reply(engine):
    request = GenerateRequest(input_ids=[[5, 6, 7], [8]], stream=True, return_logprob=True,
                              sampling_params={"temperature": 1.0, "max_new_tokens": 7, "sampling_seed": 4,
                                               "stop": ["cat sat"]})

    async def go():
        await engine.start()
        try:
            items, batched = normalize_generate(request, engine.tokenizer, vocab_size=engine.vocab_size,
                                                max_context_len=engine.max_context_len)
            plain = await engine.generate(items)
            items, _ = normalize_generate(request, engine.tokenizer, vocab_size=engine.vocab_size,
                                          max_context_len=engine.max_context_len)
            events = [e async for e in generate_events(engine, items, await engine.prepare(items), batched=batched,
                                                       incremental=True, text_in_logprobs=False)]
            return plain, events
        finally:
            await engine.stop()

    plain, events = asyncio.run(go())
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
    for index, result in enumerate(plain):
        mine = [c for c in chunks if c["index"] == index]
        assert "".join(c["text"] for c in mine) == result.text
        assert [t for c in mine for t in c["output_ids"]] == result.output_ids
        assert mine[-1]["meta_info"]["finish_reason"] == result.finish_reason
