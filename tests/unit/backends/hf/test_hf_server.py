"""The hf engine over real HTTP (one engine process for the module, launched by the launcher)."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from relax.distributed.engine_client import EngineClient, EngineError
from relax.backends.hf.decoder import BatchDecoder
from relax.backends.hf.launcher import launch_hf_engine
from relax.backends.hf.rows import DecodeRow
from relax.backends.hf.sampling import parse_sampling_params

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"temperature": 0, "max_new_tokens": 500, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    process = launch_hf_engine(str(tiny_model_dir), api_key=API_KEY)
    try:
        process.port_taken_at_launch = port_taken(int(process.url.rsplit(":", 1)[1]))  # (before it is ready)
        yield process.wait_ready(timeout=120)
    finally:
        process.terminate()


def port_taken(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_the_engine_port_is_the_engines_from_the_moment_the_launcher_picks_it(engine):
    """The launcher binds the port and hands the socket to the server (--listen-fd): no other process
    can take it in the seconds before the server starts serving (EADDRINUSE flaked engine starts)."""
    assert engine.port_taken_at_launch


def run(coro):
    return asyncio.run(coro)


async def _wait_for(client: EngineClient, key: str, value: int, timeout: float = 20.0) -> None:
    """Poll /get_server_info until info[key] == value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = await client._call("GET", "/get_server_info")
        if info[key] == value:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"server info {key} never became {value}: {info}")


def test_generate_reply_has_sglang_fields_and_matches_in_process_decoding(engine, tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer

    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            return await client.generate({"input_ids": [5, 6, 7], "return_logprob": True,
                                          "sampling_params": {"temperature": 0, "max_new_tokens": 6,
                                                              "ignore_eos": True}, "rid": "r1"})
    reply = run(go())
    meta = reply["meta_info"]
    assert meta["id"] == "r1" and meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["weight_version"]) == (3, 6, "default")
    assert [t for _, t, _ in meta["output_token_logprobs"]] == reply["output_ids"]
    local = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[2], max_context_len=512).run(
        [DecodeRow([5, 6, 7], parse_sampling_params({"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}))])[0]
    assert reply["output_ids"] == local.output_ids
    assert [lp for lp, _, _ in meta["output_token_logprobs"]] == pytest.approx(local.output_logprobs, abs=1e-4)
    assert reply["text"] == local.text


def test_input_token_logprobs_score_a_sequence_without_generating(engine, tiny_model_and_tokenizer):
    import torch

    model, _ = tiny_model_and_tokenizer
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]

    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            return await client.generate({"input_ids": prompts, "return_logprob": True, "logprob_start_len": [0, 1],
                                          "sampling_params": {"temperature": 0, "max_new_tokens": 0}})
    replies = run(go())
    for reply, prompt, start in zip(replies, prompts, [0, 1]):
        meta = reply["meta_info"]
        assert reply["output_ids"] == [] and meta["finish_reason"]["type"] == "length"
        entries = meta["input_token_logprobs"]
        assert [tok for _, tok, _ in entries] == prompt[start:]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0, :-1].float(), -1)
        expected = [None] + logp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()
        got = [lp for lp, _, _ in entries]
        assert (got[0] is None) == (start == 0)
        assert [x for x in got if x is not None] == pytest.approx([x for x in expected[start:] if x is not None],
                                                                  abs=1e-4)


def test_batched_text_request_returns_a_list(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            return await client.generate({"text": ["the cat", "hello world"], "rid": "b",
                                          "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True},
                                                              {"max_new_tokens": 3, "ignore_eos": True}]})
    replies = run(go())
    assert [r["meta_info"]["completion_tokens"] for r in replies] == [2, 3]
    assert [r["meta_info"]["id"] for r in replies] == ["b_0", "b_1"]


def test_concurrent_requests_are_decoded_in_one_batch(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            await client.pause_generation()
            before = await client._call("GET", "/get_server_info")
            tasks = [asyncio.create_task(client.generate({"input_ids": [10 + i], "sampling_params": {
                "max_new_tokens": 4, "ignore_eos": True}})) for i in range(4)]
            await _wait_for(client, "queued_requests", 4)
            await client.continue_generation()
            replies = await asyncio.gather(*tasks)
            after = await client._call("GET", "/get_server_info")
            return before, replies, after
    before, replies, after = run(go())
    assert all(r["meta_info"]["completion_tokens"] == 4 for r in replies)
    assert after["num_batches"] == before["num_batches"] + 1
    assert after["recent_batch_sizes"][-1] == 4
    assert after["num_forward_calls"] - before["num_forward_calls"] == 4  # prefill + 3 decode steps


def test_state_changing_endpoints_need_the_api_key(engine):
    for path in ("/generate", "/pause_generation", "/abort_request", "/update_weights_from_distributed",
                 "/release_memory_occupation", "/flush_cache"):
        assert httpx.post(engine.url + path, json={}).status_code == 401, path
        assert httpx.post(engine.url + path, json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    for path in ("/health", "/get_model_info", "/get_weight_version"):
        assert httpx.get(engine.url + path).status_code == 200, path
    assert httpx.get(engine.url + "/get_model_info").json()["is_generation"] is True


def test_parallel_sampling_n_returns_n_samples_per_prompt_prompt_major(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            one = await client.generate({"input_ids": [5, 6], "rid": "p", "sampling_params": {
                "n": 3, "max_new_tokens": 4, "ignore_eos": True, "sampling_seed": 1}})
            two = await client.generate({"input_ids": [[5, 6], [7]], "rid": "b", "sampling_params": {
                "n": 2, "max_new_tokens": 2, "ignore_eos": True}})
            again = await client.generate({"input_ids": [5, 6], "rid": "p", "sampling_params": {
                "n": 3, "max_new_tokens": 4, "ignore_eos": True, "sampling_seed": 1}})
            return one, two, again
    one, two, again = run(go())
    assert [r["meta_info"]["id"] for r in one] == ["p_0", "p_1", "p_2"]
    assert len({tuple(r["output_ids"]) for r in one}) > 1  # copies are seeded apart: not all equal
    assert [r["output_ids"] for r in again] == [r["output_ids"] for r in one]  # and reproducible
    assert [r["meta_info"]["id"] for r in two] == ["b_0_0", "b_0_1", "b_1_0", "b_1_1"]
    assert [r["meta_info"]["prompt_tokens"] for r in two] == [2, 2, 1, 1]


@pytest.mark.parametrize("payload, needle", [
    ({"input_ids": [5], "text": "a"}, "exactly one of"),
    ({"input_ids": [999]}, "outside [0, 64)"),
    ({"input_ids": []}, "empty"),
    ({"input_ids": "abc"}, "input_ids"),
    ({"input_ids": [5], "stream": True, "sampling_params": {"top_k": 0}}, "top_k"),  # a plain 400, not a stream
    ({"input_ids": [5], "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": [5], "sampling_params": {"max_new_tokens": 600}}, "context length"),
    ({"input_ids": [[5], [6]], "sampling_params": [{}]}, "sampling_params has 1 entries"),
    ({"input_ids": [5, 6], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len"),
    ({"input_ids": [5], "top_logprobs_num": 3}, "top_logprobs_num"),
    ({"input_ids": [5], "sampling_params": {"n": 0}}, "sampling_params.n must be in [1, 256]"),
    # (this model's word-level tokenizer joins tokens with spaces: a grammar cannot be matched on it)
    ({"input_ids": [5], "sampling_params": {"json_schema": "{}"}}, "tokens' texts concatenate to its decoded text"),
])
def test_bad_generate_payload_is_400_and_engine_keeps_serving(engine, payload, needle):
    response = httpx.post(engine.url + "/generate", json=payload, headers=AUTH)
    assert response.status_code == 400
    assert needle in response.json()["error"]["message"]
    ok = httpx.post(engine.url + "/generate", json={"input_ids": [5], "sampling_params": {"max_new_tokens": 1}},
                    headers=AUTH)
    assert ok.status_code == 200


def test_malformed_json_is_400(engine):
    response = httpx.post(engine.url + "/generate", content=b"{not json", headers={**AUTH,
                                                                                    "content-type": "application/json"})
    assert response.status_code == 400


def test_pause_aborts_in_flight_requests_and_queues_new_ones_until_continue(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            long = asyncio.create_task(client.generate({"input_ids": [5, 6], "sampling_params": LONG}))
            await _wait_for(client, "running_requests", 1)
            await client.pause_generation()
            aborted = await long
            waiting = asyncio.create_task(client.generate({"input_ids": [7], "sampling_params": {
                "max_new_tokens": 2, "ignore_eos": True}}))
            await _wait_for(client, "queued_requests", 1)
            assert not waiting.done()
            await client.continue_generation()
            return aborted, await waiting
    aborted, resumed = run(go())
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(aborted["output_ids"]) < 500
    assert resumed["meta_info"]["finish_reason"]["type"] == "length"


def test_in_place_pause_keeps_the_request_and_continue_finishes_it(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            task = asyncio.create_task(client.generate({"input_ids": [5, 6], "sampling_params": {
                **LONG, "max_new_tokens": 300}}))
            await _wait_for(client, "running_requests", 1)
            await client.pause_generation(mode="in_place")
            assert not task.done()
            await client.continue_generation()
            return await task
    assert run(go())["meta_info"]["finish_reason"] == {"type": "length", "length": 300}


def test_abort_request_by_rid(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            task = asyncio.create_task(client.generate({"input_ids": [5, 6], "rid": "to-abort",
                                                        "sampling_params": LONG}))
            await _wait_for(client, "running_requests", 1)
            await client.abort_request(rid="to-abort")
            return await task
    reply = run(go())
    assert reply["meta_info"]["finish_reason"]["type"] == "abort"
    assert reply["meta_info"]["id"] == "to-abort"


def test_release_memory_refuses_generation_until_resume(engine):
    async def go():
        async with EngineClient(engine.url, API_KEY) as client:
            await client.release_memory_occupation()
            with pytest.raises(EngineError) as info:
                await client.generate({"input_ids": [5], "sampling_params": {"max_new_tokens": 1}})
            assert not await client.health_generate()
            await client.resume_memory_occupation()
            reply = await client.generate({"input_ids": [5], "sampling_params": {"max_new_tokens": 1}})
            return info.value, reply, await client.health_generate()
    error, reply, healthy = run(go())
    assert error.status == 503 and "resume_memory_occupation" in error.message
    assert reply["meta_info"]["completion_tokens"] == 1
    assert healthy


def test_openai_client_completions_and_chat_against_the_engine(engine, tiny_model_and_tokenizer):
    """The real `openai` client (what agent code uses) against /v1: models, completions with n and
    a seed, chat through the model's chat template; greedy text equals /generate's."""
    openai = pytest.importorskip("openai")  # a test extra; absent on the GPU machine

    _, tokenizer = tiny_model_and_tokenizer
    client = openai.OpenAI(base_url=engine.url + "/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [engine_model_name(engine)]
    done = client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    direct = httpx.post(engine.url + "/generate", headers=AUTH, json={
        "text": "the cat", "sampling_params": {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}}).json()
    assert done.choices[0].text == direct["text"] and done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 5 and done.usage.prompt_tokens == len(tokenizer.encode("the cat"))
    several = client.completions.create(model="tiny", prompt=["a", "b c"], max_tokens=3, n=2, seed=3,
                                        extra_body={"ignore_eos": True})
    assert len(several.choices) == 4 and [c.index for c in several.choices] == [0, 1, 2, 3]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                             tokenize=False)
    direct = httpx.post(engine.url + "/generate", headers=AUTH, json={
        "text": rendered, "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}}).json()
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content == direct["text"]
    assert chat.object == "chat.completion" and chat.usage.completion_tokens == 4


def test_model_info_has_the_fields_sglang_clients_read(engine):
    info = httpx.get(engine.url + "/get_model_info").json()
    assert info["is_generation"] is True and info["model_type"] == "qwen3"
    assert info["architectures"] == ["Qwen3ForCausalLM"] and info["has_image_understanding"] is False


def engine_model_name(engine) -> str:
    return httpx.get(engine.url + "/get_model_info").json()["served_model_name"]


@pytest.mark.parametrize("path, payload, needle", [
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, "only allowed with stream"),
    ("/v1/completions", {"prompt": "a", "echo": True}, "echo: not supported"),
    ("/v1/completions", {"prompt": "a", "logprobs": 2}, "logprobs: not supported"),
    ("/v1/completions", {"prompt": "a", "temperature": -1}, "temperature must be >= 0"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 10000}, "context length"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "yaml"}}, "response_format.type must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
     "tool_choice 'required' needs tools"),
    ("/v1/completions", {"prompt": "a", "regex": "a", "response_format": {"type": "json_object"}},
     "response_format and regex each constrain the reply"),
])
def test_openai_fields_the_engine_does_not_do_are_400_naming_them(engine, path, payload, needle):
    response = httpx.post(engine.url + path, json=payload, headers=AUTH)
    assert response.status_code == 400 and needle in response.json()["error"]["message"]
    assert httpx.post(engine.url + path, json=payload).status_code == 401  # the API key guards /v1 too
