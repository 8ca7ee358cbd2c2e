"""Rollout routing replay (R3) in the rollout against a real `hf` engine serving a tiny Qwen3-MoE:
every sample's routing record covers all its positions but the last, each routed as one full forward
over the final tokens routes it (float32 engine), through the batched group request, a sample a
weight push aborted and resumed (its first segment's record kept, the rest appended), and a
multi-turn episode (observation tokens prefilled by the next turn's request; an aborted turn)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from agentic_helpers import WORDS, EngineServer, Traffic, generate, generator, prompt, run

from relax.engine.rollout import generator as generator_module
from relax.engine.rollout.generator import StepState
from relax.engine.specs import PartialRolloutSpec
from relax.utils.routing import RoutingShape, decode_reply, encode_reply
from tests.routing_taps import full_forward_routing

SHAPE = RoutingShape(layers=2, top_k=2, num_experts=8)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    from relax.utils.tiny_model import build_tiny_qwen3_moe, save_tiny_model, train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer([WORDS] * 20, vocab_size=300, tool_template=True)
    model = build_tiny_qwen3_moe(tokenizer, hidden_size=32, max_position_embeddings=512, seed=3)
    return save_tiny_model(model, tokenizer, str(tmp_path_factory.mktemp("moe") / "model"))


@pytest.fixture(scope="module")
def moe_engine(moe_dir):
    server = EngineServer(moe_dir, routed_experts=True, dtype="float32")
    yield server
    server.close()


@pytest.fixture(scope="module")
def full_routing(moe_dir):
    """tokens -> the routing of one full forward over them (tests/routing_taps.py)."""
    return full_forward_routing(moe_dir, SHAPE)


def r3(gen):
    gen.spec = dataclasses.replace(gen.spec, routing=SHAPE)
    return gen


def covers_the_sequence(sample, full_routing) -> None:
    record = sample.rollout_routed_experts
    assert record.shape == (len(sample.tokens) - 1, 2, 2) and record.dtype == np.uint8
    assert np.array_equal(np.sort(record, -1), full_routing(sample.tokens))


def test_a_groups_batched_request_records_every_sample(moe_engine, full_routing):
    gen = r3(generator(moe_engine, env=None, n=3, short_turns=False))
    group = [prompt("what is the price of plum", 0) for _ in range(3)]
    for i, s in enumerate(group):
        s.index = i
    for sample in run(gen.generate_group(StepState(), group)):
        assert sample.response_length > 0
        covers_the_sequence(sample, full_routing)


def test_a_resumed_sample_keeps_its_first_segments_record_and_appends(moe_engine, full_routing, monkeypatch):
    """The first reply is answered as a weight push would (its first 2 tokens, aborted), with a record
    marked so that keeping it shows; the resumed request asks from where the record ends."""
    real, calls = generator_module.post, []

    async def post(url, payload, **kw):
        reply = await real(url, payload, **kw)
        calls.append(payload)
        if len(calls) == 1:
            reply = copy.deepcopy(reply)
            meta = reply["meta_info"]
            meta["output_token_logprobs"] = meta["output_token_logprobs"][:2]
            meta["finish_reason"] = {"type": "abort", "message": "aborted by a weight update"}
            kept = len(payload["input_ids"]) + 2 - 1
            meta["routed_experts"] = encode_reply((decode_reply(meta["routed_experts"], SHAPE)[:kept] + 1) % 8)
        return reply

    monkeypatch.setattr(generator_module, "post", post)
    gen = r3(generator(moe_engine, env=None, short_turns=False, partial=PartialRolloutSpec(enabled=True)))
    sample = generate(gen, [prompt("what is the price of plum", 0)])[0]
    first, second = calls
    kept = len(first["input_ids"]) + 2 - 1
    assert sample.abort_count == 1 and second["routed_experts_start_len"] == kept
    assert second["input_ids"] == sample.tokens[:len(second["input_ids"])]
    record, full = sample.rollout_routed_experts, full_routing(sample.tokens)
    assert record.shape[0] == len(sample.tokens) - 1
    assert np.array_equal(np.sort(record[kept:], -1), full[kept:])
    assert np.array_equal(np.sort(record[:kept], -1), np.sort((full[:kept] + 1) % 8, -1))  # kept, not re-recorded


def test_a_multi_turn_episode_records_its_observations_and_an_aborted_turn(moe_engine, full_routing, monkeypatch):
    def abort_second_call(payload: dict, reply: dict, index: int) -> dict:
        if index != 1:
            return reply
        reply = copy.deepcopy(reply)
        reply["meta_info"]["finish_reason"] = {"type": "abort", "message": "aborted by a weight update"}
        return reply

    traffic = Traffic(rewrite=abort_second_call).install(monkeypatch)
    gen = r3(generator(moe_engine, env="agentic_envs", max_turns=3, partial=PartialRolloutSpec(enabled=True)))
    sample = run(gen.generate_one(StepState(), prompt("what is the price of plum", 0, mode="tool")))
    assert sample.metadata["turns"] == 3 and sample.abort_count == 1 and 0 in sample.loss_mask  # observations
    starts = [payload["routed_experts_start_len"] for payload, _ in traffic.calls]
    assert starts[0] == 0 and all(0 < s < len(p["input_ids"]) for s, (p, _) in zip(starts[1:], traffic.calls[1:]))
    covers_the_sequence(sample, full_routing)
