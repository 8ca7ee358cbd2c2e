"""The hf engine's routed experts (`--enable-return-routed-experts`, SGLang's fields) on a tiny
Qwen3-MoE: the engine's real HTTP app served in this process (uvicorn in a thread: no second
torch import), checked against full forwards of the same checkpoint. A reply covers every position
the request ran through the model (prompt + output - 1), from `routed_experts_start_len` on, so a
continuation (a resumed partial sample, the next turn of a multi-turn episode with its observation)
extends a record to exactly the full sequence's routing."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from relax.backends.hf.engine import HFEngine
from relax.backends.hf.launcher import engine_option_args
from relax.distributed.engine_client import EngineClient
from relax.utils.routing import RoutingShape, decode_reply, extend
from tests.routing_taps import full_forward_routing

SHAPE = RoutingShape(layers=2, top_k=2, num_experts=8)
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    from relax.backends.hf.tiny_model import build_tiny_tokenizer
    from relax.utils.tiny_model import build_tiny_qwen3_moe, save_tiny_model

    tokenizer = build_tiny_tokenizer()
    return save_tiny_model(build_tiny_qwen3_moe(tokenizer, hidden_size=32), tokenizer,
                           str(tmp_path_factory.mktemp("moe") / "model"))


@pytest.fixture(scope="module")
def engine(moe_dir):
    import threading

    import uvicorn

    from relax.backends.hf.server import create_app, parse_args
    from relax.utils.net import free_port

    args = parse_args(["--model-path", moe_dir, *engine_option_args({"enable_return_routed_experts": True})])
    engine = HFEngine(moe_dir, seed=0, routed_experts=args.enable_return_routed_experts)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        thread.join(0.02)
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}")
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def full_routing(moe_dir):
    """tokens -> the routing of one full forward over them (tests/routing_taps.py)."""
    return full_forward_routing(moe_dir, SHAPE)


def generate(engine, payload: dict) -> dict | list:
    async def go():
        async with EngineClient(engine.url) as client:
            return await client.generate(payload)
    return asyncio.run(go())


def test_the_option_maps_to_the_server_flag():
    assert engine_option_args({"enable_return_routed_experts": True}) == ["--enable-return-routed-experts"]
    assert engine_option_args({"enable_return_routed_experts": False}) == []


def test_a_reply_routes_every_forwarded_position_as_a_full_forward(engine, full_routing):
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    replies = generate(engine, {"input_ids": prompts, "return_routed_experts": True, "return_logprob": True,
                                "sampling_params": dict(GREEDY, max_new_tokens=6)})
    for prompt, reply in zip(prompts, replies):
        ids = decode_reply(reply["meta_info"]["routed_experts"], SHAPE)
        tokens = prompt + reply["output_ids"]
        assert ids.shape == (len(tokens) - 1, 2, 2)  # SGLang's seqlen - 1: the last token is never forwarded
        assert np.array_equal(np.sort(ids, -1), full_routing(tokens))
    assert "routed_experts" not in generate(engine, {"input_ids": [5, 6], "sampling_params": GREEDY})["meta_info"]


def test_a_continuation_from_the_records_end_extends_it_to_the_whole_sequence(engine, full_routing):
    """Turn 1, then an observation appended and turn 2 asked from where the record ends: the record
    covers every position but the last, each as a full forward over the final sequence routes it."""
    prompt, observation = [5, 6, 7, 8], [12, 13, 14]
    first = generate(engine, {"input_ids": prompt, "return_routed_experts": True,
                              "sampling_params": dict(GREEDY, max_new_tokens=4)})
    record = extend(None, decode_reply(first["meta_info"]["routed_experts"], SHAPE), 0)
    tokens = prompt + first["output_ids"] + observation
    assert len(record) == len(prompt) + 4 - 1
    second = generate(engine, {"input_ids": tokens, "return_routed_experts": True,
                               "routed_experts_start_len": len(record),
                               "sampling_params": dict(GREEDY, max_new_tokens=3)})
    reply = decode_reply(second["meta_info"]["routed_experts"], SHAPE)
    assert len(reply) == len(tokens) + 3 - 1 - len(record)  # the old last token, the observation, the new ones
    record = extend(record, reply, len(record))
    tokens = tokens + second["output_ids"]
    assert np.array_equal(np.sort(record, -1), full_routing(tokens))


@pytest.mark.parametrize("payload,needle", [
    ({"input_ids": [5, 6], "return_routed_experts": True, "routed_experts_start_len": 3}, "must be in [0, 2]"),
    ({"input_ids": [5, 6], "return_routed_experts": True, "routed_experts_start_len": -1}, "must be in [0, 2]"),
])
def test_a_start_past_the_prompt_is_400(engine, payload, needle):
    import httpx

    reply = httpx.post(f"{engine.url}/generate", json=payload, timeout=30)
    assert reply.status_code == 400 and needle in reply.json()["error"]["message"]


def test_asking_an_engine_started_without_the_flag_or_a_dense_one_is_refused(moe_dir, tiny_model_dir):
    from relax.backends.hf.protocol import GenerateRequest, normalize_generate

    engine = HFEngine(moe_dir)
    items, _ = normalize_generate(GenerateRequest(input_ids=[5, 6], return_routed_experts=True), engine.tokenizer,
                                  vocab_size=engine.vocab_size, max_context_len=engine.max_context_len)
    with pytest.raises(ValueError, match="without --enable-return-routed-experts"):
        asyncio.run(engine.prepare(items))
    with pytest.raises(ValueError, match="is dense"):
        HFEngine(str(tiny_model_dir), routed_experts=True)
