"""The hf engine on CUDA: generation, memory release, and NCCL weight push (GPU machines only)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relax.distributed.engine_client import EngineClient
from relax.backends.hf.launcher import launch_hf_engine
from relax.distributed.weights.sender import WeightSender

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GREEDY = {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}}


@pytest.fixture(scope="module")
def engine_device() -> str:
    """The engine takes the last GPU, so with two GPUs the trainer side (cuda:0) is another one."""
    return f"cuda:{torch.cuda.device_count() - 1}"


@pytest.fixture(scope="module")
def engine(tiny_model_dir, engine_device):
    process = launch_hf_engine(str(tiny_model_dir), device=engine_device, extra_args=["--dtype", "float32"])
    try:
        yield process.wait_ready(timeout=180)
    finally:
        process.terminate()


def _reference(model_dir, device, prompt, n):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            token = int(model(torch.tensor([ids], device=device)).logits[0, -1].argmax())
            ids.append(token)
            out.append(token)
    return out


def test_cuda_engine_greedy_matches_reference_and_releases_memory(engine, tiny_model_dir, engine_device):
    async def go():
        async with EngineClient(engine.url) as client:
            reply = await client.generate(GREEDY)
            held = (await client._call("GET", "/get_server_info"))["cuda_memory_allocated"]
            await client.release_memory_occupation()
            released = (await client._call("GET", "/get_server_info"))["cuda_memory_allocated"]
            await client.resume_memory_occupation()
            again = await client.generate(GREEDY)
            return reply, held, released, again
    reply, held, released, again = asyncio.run(go())
    assert reply["output_ids"] == _reference(tiny_model_dir, engine_device, GREEDY["input_ids"], 8)
    assert held > 0 and released < held
    assert again["output_ids"] == reply["output_ids"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL push needs two GPUs (one per rank)")
def test_nccl_push_from_another_gpu_changes_generations(engine, other_tiny_model_dir, engine_device):
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(other_tiny_model_dir).to("cuda:0").state_dict()

    async def go():
        torch.cuda.set_device(0)
        sender = WeightSender([engine.url], backend="nccl", bucket_bytes=16 * 1024, timeout_s=120)
        await sender.connect()
        try:  # two pushes: the second's buckets queue behind the first's on the same streams
            await sender.push(state.items(), version=2)
            stats = await sender.push(state.items(), version=3)
        finally:
            await sender.close()
        async with EngineClient(engine.url) as client:
            return stats, await client.generate(GREEDY)
    stats, reply = asyncio.run(go())
    assert stats.num_buckets > 1 and reply["meta_info"]["weight_version"] == "3"
    assert reply["output_ids"] == _reference(other_tiny_model_dir, engine_device, GREEDY["input_ids"], 8)


def test_cuda_ipc_push_on_the_same_gpu_changes_generations_and_refuses_other_pickles(
        engine, other_tiny_model_dir, engine_device):
    """Sender and engine on one GPU (colocate): /update_weights_from_tensor with CUDA IPC handles."""
    import base64
    import os
    import pickle

    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(other_tiny_model_dir).to(engine_device).state_dict()

    class Exploit:
        def __reduce__(self):
            return os.system, ("true",)

    async def go():
        sender = WeightSender([engine.url], backend="nccl", bucket_bytes=16 * 1024, timeout_s=120,
                              device=torch.device(engine_device), ipc_ranks=[1])
        await sender.connect()
        try:
            stats = await sender.push(state.items(), version=4)
        finally:
            await sender.close()
        async with EngineClient(engine.url) as client:
            reply = await client.generate(GREEDY)
            bad = base64.b64encode(pickle.dumps([("w", Exploit())])).decode()
            try:
                await client._call("POST", "/update_weights_from_tensor", {"serialized_named_tensors": [bad]})
                refused = None
            except Exception as exc:  # noqa: BLE001 - the 400 is what is checked
                refused = str(exc)
        return stats, reply, refused

    stats, reply, refused = asyncio.run(go())
    assert stats.num_buckets > 1 and reply["meta_info"]["weight_version"] == "4"
    assert reply["output_ids"] == _reference(other_tiny_model_dir, engine_device, GREEDY["input_ids"], 8)
    assert refused is not None and "names posix.system" in refused


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL push needs two GPUs (one per rank)")
def test_an_nccl_push_ahead_refused_for_a_forgotten_layout_is_drained_and_pushed_again(
        engine, tiny_model_dir, other_tiny_model_dir, engine_device):
    """Pushes ahead of the arms' answers over NCCL: the engine is made to forget the first layout (four newer
    ones push it out of the layouts it keeps), so that layout's next push, sent ahead by its id, is refused
    (409): the engine drains its buckets on the GPU and the sender pushes again with the layout."""
    from transformers import AutoModelForCausalLM

    from relax.distributed.weights.armed import LAYOUTS_KEPT

    states = [AutoModelForCausalLM.from_pretrained(d).to("cuda:0").state_dict()
              for d in (tiny_model_dir, other_tiny_model_dir)]

    async def go():
        torch.cuda.set_device(0)
        sender = WeightSender([engine.url], backend="nccl", bucket_bytes=16 * 1024, timeout_s=120)
        await sender.connect()
        try:
            assert sender.ahead
            version = 10
            for bucket_kib in [16, *(8 * 2 ** i for i in range(1, LAYOUTS_KEPT + 1))]:
                sender.bucket_bytes = bucket_kib << 10
                version += 1
                await sender.push(states[0].items(), version=version)
            sender.bucket_bytes = 16 << 10  # the first layout: ahead by id, which the engine no longer holds
            stats = await sender.push(states[1].items(), version=version + 1)
        finally:
            await sender.close()
        async with EngineClient(engine.url) as client:
            return stats, await client.generate(GREEDY)

    stats, reply = asyncio.run(go())
    assert stats.num_buckets > 1 and reply["meta_info"]["weight_version"] == str(stats.version)
    assert reply["output_ids"] == _reference(other_tiny_model_dir, engine_device, GREEDY["input_ids"], 8)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL push needs two GPUs (one per rank)")
def test_a_push_ahead_to_a_dead_engine_fails_and_close_aborts_the_broadcast_left_on_the_gpu(
        tiny_model_dir, engine_device):
    """An engine gone between two pushes: the second push's buckets are queued on NCCL before its arm fails
    (no receiver will take them). The push fails naming the engine, and close() aborts the group, so the
    queued broadcast ends and the sender's GPU is usable (NCCL's watchdog would otherwise end this process
    at the group's timeout)."""
    import threading
    import time

    from transformers import AutoModelForCausalLM

    from relax.distributed.weights.protocol import WeightSyncError

    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir).to("cuda:0").state_dict()
    process = launch_hf_engine(str(tiny_model_dir), device=engine_device, extra_args=["--dtype", "float32"])
    ready = process.wait_ready(timeout=180)

    async def go():
        torch.cuda.set_device(0)
        sender = WeightSender([ready.url], backend="nccl", bucket_bytes=16 * 1024, timeout_s=60)
        await sender.connect()
        await sender.push(state.items(), version=1)
        await sender.push(state.items(), version=2)  # (ahead)
        process.terminate()
        start = time.monotonic()
        try:
            with pytest.raises(WeightSyncError) as info:
                await sender.push(state.items(), version=3)
            failed = time.monotonic() - start
        finally:
            start = time.monotonic()
            await sender.close()
            closed = time.monotonic() - start
        return str(info.value), failed, closed

    try:
        message, failed, closed = asyncio.run(go())
    finally:
        process.terminate()
    done = threading.Event()
    threading.Thread(target=lambda: (torch.cuda.synchronize(0), done.set()), daemon=True).start()
    assert ready.url in message and failed < 20 and closed < 20
    assert done.wait(20), "the sender's GPU still has a broadcast queued that never ends"
