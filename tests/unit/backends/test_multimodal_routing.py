"""R3 on media rows: the hf engine records the experts of every prompt position, image and audio pad
tokens included (their features go through the routers like any token's), and the fsdp trainer,
scoring the same rows with the same encoder tensors, routes each position as recorded (float32:
its own routing equals the record) and replaying the record gives the engine's log-probs. A tiny
Qwen3-Omni thinker (its language model is MoE): an audio row, an audio + image row, a text row."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from test_multimodal_backends import TEMPERATURE, encode

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed import transfer_queue as tq
from relax.types import Sample
from relax.utils.net import free_port
from relax.utils.routing import RoutingShape, decode_reply, to_bytes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_omni

    tokenizer = train_chatml_tokenizer(["which cell is red? and this one no image here is the second tone higher?"]
                                       * 10, vocab_size=300)
    return build_tiny_omni(tokenizer, str(tmp_path_factory.mktemp("qwen3_omni")))


def generate(model_dir: str, encoded) -> list[dict]:
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateRequest, build_output, normalize_generate

    async def run():
        engine = HFEngine(model_dir, seed=0, routed_experts=True)
        req = GenerateRequest(input_ids=[e.input_ids for e in encoded], return_logprob=True, return_routed_experts=True,
                              image_data=[e.request.get("image_data") for e in encoded],
                              audio_data=[e.request.get("audio_data") for e in encoded],
                              sampling_params=[dict(temperature=TEMPERATURE, max_new_tokens=8, ignore_eos=True,
                                                    sampling_seed=i) for i in range(len(encoded))])
        items, _ = normalize_generate(req, engine.tokenizer, vocab_size=engine.vocab_size,
                                      max_context_len=engine.max_context_len)
        await engine.start()
        try:
            return [build_output(i, r, weight_version="0", e2e_latency=0.0) for i, r in
                    zip(items, await engine.generate(items))]
        finally:
            await engine.stop()

    return asyncio.run(run())


def test_media_positions_are_recorded_and_replayed(model_dir):
    from relax.backends.trainer.trainer import Trainer

    encoded = encode(model_dir)[:3]  # audio; audio + image; text
    replies = generate(model_dir, encoded)
    shape = RoutingShape(layers=2, top_k=2, num_experts=4)
    samples = [Sample(index=i, tokens=e.input_ids + r["output_ids"], response_length=len(r["output_ids"]),
                      multimodal_train_inputs=e.tensors or None,
                      rollout_log_probs=[lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]],
                      rollout_routed_experts=decode_reply(r["meta_info"]["routed_experts"], shape))
               for i, (e, r) in enumerate(zip(encoded, replies))]
    assert all(s.rollout_routed_experts.shape == (len(s.tokens) - 1, 2, 2) for s in samples)
    media = tq.media_bytes(tq.media_column(samples).unbind())
    routing = tq.media_bytes(tq.routing_column(samples, shape).unbind())  # through the data plane's columns
    tokens, lengths = [s.tokens for s in samples], [s.response_length for s in samples]
    worker = Trainer(0, 1, "127.0.0.1", free_port(), TrainerSpec(
        model_path=model_dir, optim=OptimizerConfig(lr=1e-2), batch=BatchConfig(micro_batch_size=3),
        loss=PolicyLossConfig(), temperature=TEMPERATURE, threads=1, routing_replay=True))
    try:
        worker.compute_log_probs(tokens, lengths, media)  # the policy's first forward records its own routing
        for s in samples:
            own = worker.routes.kept[tuple(s.tokens)]
            assert np.array_equal(np.sort(own, -1), np.sort(s.rollout_routed_experts, -1)), s.index
        replayed = worker.compute_log_probs(tokens, lengths, media, routing=routing)
        for s, lp in zip(samples, replayed):
            assert (torch.tensor(lp) - torch.tensor(s.rollout_log_probs)).abs().max().item() < 1e-4
    finally:
        worker.shutdown()
    assert to_bytes(samples[0].rollout_routed_experts, shape) == routing[0]
