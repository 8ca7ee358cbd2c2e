"""Weight push end to end: a WeightSender in this process -> a live hf engine over gloo."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from relax.distributed.engine_client import EngineClient, EngineError
from relax.backends.hf.launcher import launch_hf_engine
from relax.distributed.weights.protocol import WeightSyncError
from relax.distributed.weights.sender import WeightSender

API_KEY = "sync-key"
GREEDY = {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    process = launch_hf_engine(str(tiny_model_dir), api_key=API_KEY)
    try:
        yield process.wait_ready(timeout=120)
    finally:
        process.terminate()


@pytest.fixture(scope="module")
def other_state_dict(other_tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(other_tiny_model_dir)
    return model, {name: p.detach().clone() for name, p in model.state_dict().items()}


async def _version(url: str) -> str:
    async with EngineClient(url) as client:  # GET /get_* needs no key
        return await client.get_weight_version()


async def _generate(url: str) -> dict:
    async with EngineClient(url, API_KEY) as client:
        return await client.generate(GREEDY)


def test_push_replaces_weights_and_sets_version(engine, other_state_dict, reference_greedy):
    other_model, state = other_state_dict

    async def go():
        before = await _generate(engine.url)
        sender = WeightSender([engine.url], api_key=API_KEY, backend="gloo", bucket_bytes=16 * 1024, timeout_s=60)
        await sender.connect()
        try:
            stats = await sender.push(state.items(), version=1)
            after = await _generate(engine.url)
            async with EngineClient(engine.url, API_KEY) as client:
                version = await client.get_weight_version()
        finally:
            await sender.close()
        return before, stats, after, version, sender.depth

    before, stats, after, version, depth = asyncio.run(go())
    assert depth > 1  # the hf engine loads buckets in order: several were in flight at once
    expected, _ = reference_greedy(other_model, GREEDY["input_ids"], 8)
    assert after["output_ids"] == expected
    assert before["output_ids"] != expected
    assert version == "1" and after["meta_info"]["weight_version"] == "1"
    assert stats.bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert stats.num_buckets > 1 and stats.version == 1 and stats.gbps > 0


def test_bad_tensor_name_fails_fast_and_engine_keeps_serving(engine, other_state_dict):
    _, state = other_state_dict
    good = ("model.norm.weight", torch.zeros_like(state["model.norm.weight"]))

    async def go():
        sender = WeightSender([engine.url], api_key=API_KEY, backend="gloo", timeout_s=60)
        await sender.connect()
        try:
            version_before = await _version(engine.url)
            reply_before = await _generate(engine.url)
            start = time.monotonic()
            with pytest.raises(WeightSyncError) as info:
                await sender.push([good, ("model.no_such_layer.weight", torch.ones(3, 4))], version=7)
            elapsed = time.monotonic() - start
            reply_after = await _generate(engine.url)
            version_after = await _version(engine.url)
            # the group survived: a correct push still works
            stats = await sender.push([good], version=8)
            version_final = await _version(engine.url)
        finally:
            await sender.close()
        return info.value, elapsed, reply_before, reply_after, version_before, version_after, stats, version_final

    error, elapsed, before, after, v_before, v_after, stats, v_final = asyncio.run(go())
    assert "model.no_such_layer.weight" in str(error) and "not a parameter" in str(error)
    assert elapsed < 10
    assert after["output_ids"] == before["output_ids"]  # nothing of the rejected bucket was loaded
    assert v_after == v_before
    assert stats.num_buckets == 1 and v_final == "8"


def test_malformed_weight_update_is_400_and_quarantines_the_group(engine):
    async def go():
        sender = WeightSender([engine.url], api_key=API_KEY, backend="gloo", timeout_s=30)
        await sender.connect()
        async with EngineClient(engine.url, API_KEY) as client:
            with pytest.raises(EngineError) as unknown_group:
                await client.update_weights_from_distributed(names=["x"], dtypes=["float32"], shapes=[[1]],
                                                             group_name="nope")
            with pytest.raises(EngineError) as bad_dtype:
                await client.update_weights_from_distributed(names=["x"], dtypes=["complex7"], shapes=[[1]],
                                                             group_name=sender.group_name)
            with pytest.raises(WeightSyncError, match="out of step"):  # refused, not misparsed
                await sender.push([("model.norm.weight", torch.ones(32))], version=9)
            await sender.close()
            info = await client._call("GET", "/get_server_info")
            reply = await client.generate(GREEDY)
        return unknown_group.value, bad_dtype.value, info, reply
    unknown_group, bad_dtype, info, reply = asyncio.run(go())
    assert unknown_group.status == 400 and "no weight update group named 'nope'" in unknown_group.message
    assert bad_dtype.status == 400 and "unknown dtype 'complex7'" in bad_dtype.message
    assert info["weight_update_groups"] == [] and info["weight_version"] != "9"
    assert reply["meta_info"]["completion_tokens"] == 8


def test_ipc_weight_update_on_a_cpu_engine_is_a_clear_400(engine):
    """CUDA IPC handles need the sender's GPU; a CPU engine says which path to use instead."""
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            with pytest.raises(EngineError) as err:
                await client._call("POST", "/update_weights_from_tensor", {"serialized_named_tensors": ["eA=="]})
        return err.value

    err = asyncio.run(go())
    assert err.status == 400 and "CUDA IPC handles" in err.message and "update_weights_from_distributed" in err.message
