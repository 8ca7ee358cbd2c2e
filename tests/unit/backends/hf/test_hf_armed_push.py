"""Relax's armed push end to end (relax/distributed/weights/armed.py): a WeightSender in this process ->
live hf engines over gloo. Two control requests a push whatever its bucket count, counted on the wire
by the sender's HTTP transport; the engine then generates as the pushed model does."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
import torch

from relax.backends.hf.launcher import launch_hf_engine
from relax.distributed.engine_client import EngineClient
from relax.distributed.weights.armed import ARM_PATH, END_PATH
from relax.distributed.weights.endpoints import ARMED, HTTPEndpoint
from relax.distributed.weights.protocol import BucketRejected
from relax.distributed.weights.sender import WeightSender

API_KEY = "armed-key"
GREEDY = {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}}


class Counted(httpx.AsyncBaseTransport):
    """The sender's HTTP transport, recording the path of every request that goes out."""

    def __init__(self) -> None:
        self.inner, self.paths = httpx.AsyncHTTPTransport(), []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class NotArmed(HTTPEndpoint):
    """An hf engine as one that predates the armed push sees it: every other extension, not that one."""

    async def features(self) -> frozenset[str]:
        return await super().features() - {ARMED}


def _launch(model_dir):
    return launch_hf_engine(str(model_dir), api_key=API_KEY)


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    processes = [_launch(tiny_model_dir), _launch(tiny_model_dir)]
    try:
        yield [p.wait_ready(timeout=120) for p in processes]
    finally:
        for p in processes:
            p.terminate()
    # (a launch without a log path logs to the temp dir, and a clean stop takes that file along)
    assert all(p.temp_log and not os.path.exists(p.log_path) for p in processes)


@pytest.fixture(scope="module")
def models(tiny_model_dir, other_tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return [AutoModelForCausalLM.from_pretrained(d).eval() for d in (tiny_model_dir, other_tiny_model_dir)]


def _state(model) -> list[tuple[str, torch.Tensor]]:
    return [(name, t.detach().clone()) for name, t in model.state_dict().items()]


async def _generate(url: str) -> dict:
    async with EngineClient(url, API_KEY) as client:
        return await client.generate(GREEDY)


def test_an_armed_push_is_two_requests_whatever_its_bucket_count(engines, models, reference_greedy):
    """Pushes of 1 and of many buckets, then the first model back: two requests each (the arm, the end),
    and the engine generates as the model pushed to it does, at the pushed version."""
    url, (original, other) = engines[0].url, models

    async def go():
        replies, buckets, paths = [], [], []
        for version, (model, bucket_bytes) in enumerate([(other, 1 << 20), (original, 8 << 10), (other, 8 << 10)]):
            counted = Counted()
            sender = WeightSender([HTTPEndpoint(url, api_key=API_KEY, transport=counted)], backend="gloo",
                                  bucket_bytes=bucket_bytes, timeout_s=60)
            await sender.connect()
            try:
                counted.paths.clear()
                stats = await sender.push(_state(model), version=10 + version)
                paths.append(list(counted.paths))
                replies.append(await _generate(url))
            finally:
                await sender.close()
            buckets.append(stats.num_buckets)
        return replies, buckets, paths

    replies, buckets, paths = asyncio.run(go())
    assert buckets[0] == 1 and buckets[1] > 4 and buckets[2] == buckets[1]
    assert paths == [[ARM_PATH, END_PATH]] * 3
    expected = [reference_greedy(m, GREEDY["input_ids"], 8)[0] for m in (other, original, other)]
    assert [r["output_ids"] for r in replies] == expected and expected[0] != expected[1]
    assert [r["meta_info"]["weight_version"] for r in replies] == ["10", "11", "12"]


def test_a_fleet_of_an_armed_engine_and_one_that_is_not_takes_one_push(engines, models, reference_greedy):
    armed_url, plain_url = engines[0].url, engines[1].url
    armed_wire, plain_wire = Counted(), Counted()

    async def go():
        receivers = [HTTPEndpoint(armed_url, api_key=API_KEY, transport=armed_wire),
                     NotArmed(plain_url, api_key=API_KEY, transport=plain_wire)]
        sender = WeightSender(receivers, backend="gloo", bucket_bytes=8 << 10, timeout_s=60)
        await sender.connect()
        try:
            armed_wire.paths.clear()
            plain_wire.paths.clear()
            stats = await sender.push(_state(models[1]), version=21)
            wires = list(armed_wire.paths), list(plain_wire.paths)
        finally:
            await sender.close()
        return sender.armed, stats, wires, await _generate(armed_url), await _generate(plain_url)

    armed, stats, (armed_paths, plain_paths), armed_reply, plain_reply = asyncio.run(go())
    assert [r.url for r in armed] == [armed_url] and stats.num_buckets > 4
    assert armed_paths == [ARM_PATH, END_PATH]
    assert plain_paths.count("/update_weights_from_distributed") == stats.num_buckets
    plain_control = {"/pause_generation", "/begin_weight_update", "/end_weight_update", "/continue_generation"}
    assert plain_control <= set(plain_paths)
    expected, _ = reference_greedy(models[1], GREEDY["input_ids"], 8)
    assert armed_reply["output_ids"] == plain_reply["output_ids"] == expected
    assert armed_reply["meta_info"]["weight_version"] == plain_reply["meta_info"]["weight_version"] == "21"


def test_a_failure_in_the_armed_loop_is_the_end_calls_reply_and_the_engine_keeps_serving(engines, models):
    url = engines[0].url

    async def go():
        sender = WeightSender([url], api_key=API_KEY, backend="gloo", bucket_bytes=8 << 10, timeout_s=60)
        await sender.connect()
        try:
            await sender.push(_state(models[0]), version=30)
            before = await _generate(url)
            bad = _state(models[1]) + [("model.no_such_layer.weight", torch.ones(3, 4))]
            with pytest.raises(BucketRejected) as info:
                await sender.push(bad, version=31)
            after = await _generate(url)
            stats = await sender.push(_state(models[1])[:2], version=32)  # the group is in step: re-armed
        finally:
            await sender.close()
        return str(info.value), before, after, stats

    message, before, after, stats = asyncio.run(go())
    assert f"{url}{END_PATH}: HTTP 400" in message
    assert "'model.no_such_layer.weight' is not a parameter of the model" in message
    # the push's earlier buckets are in; the version is not taken, and generation was resumed
    assert after["meta_info"]["weight_version"] == "30" and after["meta_info"]["completion_tokens"] == 8
    assert before["meta_info"]["weight_version"] == "30" and stats.version == 32
