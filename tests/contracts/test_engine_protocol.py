"""The engine protocol contract: what Relax's rollout, weight sync and colocate offload ask of an
inference engine, checked through the same client (`EngineClient`, `WeightSender`) against every
inference backend, so each backend is held to the same behaviour.

`hf` runs here (CPU, in CI); `sglang` runs where it exists (marked `gpu`: it needs sglang and a
CUDA device) and is skipped elsewhere with the reason. Each backend is launched through the
backend registry exactly as a run launches it.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch

from relax.distributed.engine_client import EngineClient, EngineError
from relax.backends.registry import INFERENCE_BACKENDS
from relax.distributed.weights.sender import WeightSender
from relax.utils.plugins import import_object

API_KEY = "contract-key"
PROMPT = [5, 6, 7, 8]


def _backend_params():
    gpu_ready = torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None
    return [pytest.param("hf", id="hf"),
            # The hf engine's GPU decode path (slot KV cache + CUDA graphs, released with its memory).
            pytest.param("hf-cuda", id="hf-cuda", marks=[
                pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
            pytest.param("sglang", id="sglang", marks=[
                pytest.mark.gpu,
                pytest.mark.skipif("sglang" not in INFERENCE_BACKENDS or not gpu_ready,
                                   reason="the sglang backend needs sglang installed, a CUDA GPU and its "
                                          "launcher in this build")])]


@pytest.fixture(scope="module", params=_backend_params())
def engine(request, tmp_path_factory):
    from relax.backends.hf.tiny_model import build_tiny_qwen3

    backend, device = request.param.partition("-")[::2]
    model_dir = build_tiny_qwen3(tmp_path_factory.mktemp("contract-model"), seed=0)
    launch = import_object(INFERENCE_BACKENDS[backend], flag="--rollout-backend")
    handle = launch(str(model_dir), api_key=API_KEY, num_threads=1,
                    log_path=str(tmp_path_factory.mktemp("contract-logs") / "engine.log"),
                    options=None, **({"device": "cuda:0"} if backend == "sglang" or device == "cuda" else {}))
    try:
        handle.wait_ready(300)
        handle.backend, handle.model_dir = backend, model_dir
        yield handle
    finally:
        handle.terminate()


def call(engine, method: str, *args, **kwargs):
    async def go():
        async with EngineClient(engine.url, API_KEY, timeout=60) as client:
            return await getattr(client, method)(*args, **kwargs)
    return asyncio.run(go())


def greedy(n: int, **extra) -> dict:
    return {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True, **extra}}


def test_health_and_info(engine):
    assert call(engine, "health")
    info = call(engine, "get_model_info")
    assert info["is_generation"] is True and info["model_path"]
    assert isinstance(call(engine, "get_server_info"), dict)


def test_server_and_model_info_have_sglangs_fields(engine):
    """The fields SGLang's /get_server_info (ServerArgs + scheduler info + internal_states + version) and
    /get_model_info return that clients read, and those Relax reads; no API key is reported."""
    info = call(engine, "get_server_info")
    for key in ("model_path", "tokenizer_path", "host", "port", "tp_size", "dp_size", "context_length",
                "max_running_requests", "max_total_num_tokens", "random_seed", "served_model_name", "version",
                "internal_states"):
        assert key in info, key
    assert info["tp_size"] >= 1 and info["dp_size"] >= 1 and info["context_length"] > len(PROMPT)
    assert info["max_total_num_tokens"] >= info["context_length"] and info["port"] == int(engine.url.rsplit(":", 1)[1])
    assert isinstance(info["version"], str) and info["version"]
    states = info["internal_states"]
    assert isinstance(states, list) and states and all(isinstance(s, dict) for s in states)
    assert all(s.get("last_gen_throughput", 0) >= 0 for s in states)
    assert API_KEY not in str(info)
    if engine.backend == "hf":  # what Relax reads from its own engine
        for key in ("busy_seconds", "cuda_memory_allocated", "weight_version", "released_tags", "queued_requests"):
            assert key in info, key
        assert all("load" in s for s in states)
    model = call(engine, "get_model_info")
    for key in ("model_path", "tokenizer_path", "served_model_name", "is_generation", "weight_version",
                "model_type", "architectures", "has_image_understanding"):
        assert key in model, key


def test_generate_reply_shape_and_logprobs(engine):
    reply = call(engine, "generate", {**greedy(6), "rid": "contract-1"})
    meta = reply["meta_info"]
    assert meta["id"] == "contract-1" and meta["finish_reason"]["type"] == "length"
    assert len(reply["output_ids"]) == meta["completion_tokens"] == 6 and meta["prompt_tokens"] == len(PROMPT)
    triples = meta["output_token_logprobs"]
    assert [t for _, t, _ in triples] == reply["output_ids"] and all(lp <= 0 for lp, _, _ in triples)
    assert call(engine, "generate", greedy(6))["output_ids"] == reply["output_ids"]  # greedy is deterministic


def test_sampling_params_stop_and_seed(engine):
    first = call(engine, "generate", greedy(6))["output_ids"]
    stopped = call(engine, "generate", greedy(6, stop_token_ids=[first[2]]))
    assert stopped["meta_info"]["finish_reason"]["type"] == "stop" and len(stopped["output_ids"]) <= 3
    seeded = {"input_ids": PROMPT, "sampling_params": {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True,
                                                       "sampling_seed": 11}}
    assert call(engine, "generate", seeded)["output_ids"] == call(engine, "generate", seeded)["output_ids"]


def test_batch_and_input_logprobs(engine):
    replies = call(engine, "generate", {"input_ids": [PROMPT, PROMPT[:2]], "return_logprob": True,
                                        "logprob_start_len": 0,
                                        "sampling_params": {"temperature": 0, "max_new_tokens": 0}})
    assert isinstance(replies, list) and len(replies) == 2
    for reply, prompt in zip(replies, [PROMPT, PROMPT[:2]]):
        entries = reply["meta_info"]["input_token_logprobs"]
        assert [t for _, t, _ in entries] == prompt and entries[0][0] is None


def test_abort_all_ends_a_running_request(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY, timeout=60) as client:
            long = asyncio.ensure_future(client.generate(greedy(500)))
            await asyncio.sleep(0.05)  # queued or running: abort_all ends it either way
            await client.abort_request(abort_all=True)
            return await long
    assert asyncio.run(go())["meta_info"]["finish_reason"]["type"] == "abort"


def test_pause_continue_flush(engine):
    call(engine, "pause_generation", "abort")
    call(engine, "continue_generation")
    call(engine, "flush_cache")
    assert call(engine, "generate", greedy(2))["meta_info"]["completion_tokens"] == 2


def test_release_and_resume_memory(engine):
    before = call(engine, "generate", greedy(4))["output_ids"]
    call(engine, "release_memory_occupation")
    call(engine, "resume_memory_occupation")
    assert call(engine, "generate", greedy(4))["output_ids"] == before


def test_weight_group_update_and_version(engine):
    """init -> update (the model's own weights, as a run pushes them) -> destroy; the version moves,
    the model answers as before."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(engine.model_dir).state_dict()
    backend = "nccl" if engine.backend == "sglang" else "gloo"
    before = call(engine, "generate", greedy(4))["output_ids"]

    async def go():
        sender = WeightSender([engine.url], api_key=API_KEY, backend=backend, bucket_bytes=16 * 1024, timeout_s=60)
        await sender.connect()
        try:
            await sender.push(state.items(), version=7)
        finally:
            await sender.close()
    asyncio.run(go())
    assert call(engine, "get_weight_version") == "7"
    assert call(engine, "generate", greedy(4))["output_ids"] == before


def test_weight_update_session_opens_once_and_closes_once(engine):
    """SGLang's session rules (updates load between begin and end): a second begin and an end
    without a begin are refused with success=false, and the engine keeps serving."""
    async def go():
        async with EngineClient(engine.url, API_KEY, timeout=60) as client:
            assert (await client.begin_weight_update())["success"] is True
            with pytest.raises(EngineError, match="already open"):
                await client.begin_weight_update()
            assert (await client.end_weight_update())["success"] is True
            with pytest.raises(EngineError, match="no weight-update session is open"):
                await client.end_weight_update()
    asyncio.run(go())
    assert call(engine, "generate", greedy(2))["output_ids"]


def test_a_bad_request_is_an_error_and_the_engine_keeps_serving(engine):
    with pytest.raises(EngineError) as err:
        call(engine, "generate", {"input_ids": PROMPT, "sampling_params": {"top_p": 7}})
    assert err.value.status == 400
    assert call(engine, "generate", greedy(1))["meta_info"]["completion_tokens"] == 1
