"""The engine protocol contract: what Relax's rollout, weight sync and colocate offload ask of an
inference engine, checked through the same client (`EngineClient`, `WeightSender`) against every
inference backend, so each backend is held to the same behaviour.

`hf` runs here (CPU, in CI); `sglang` runs where it exists (marked `gpu`: it needs sglang and a
CUDA device) and is skipped elsewhere with the reason. Each backend is launched through the
backend registry exactly as a run launches it, once per module, on a tiny Qwen3 with a byte-level
BPE tokenizer (constrained decoding needs one whose tokens spell its text).

Streaming (`"stream": true`, SGLang's server-sent events; OpenAI's `stream` with usage) and
constrained decoding (`regex`, `json_schema`, `ebnf`, `structural_tag`; OpenAI's `response_format`
and forced `tool_choice`) are held to SGLang's behaviour too: a streamed request ends as the same
request unstreamed, every constrained sample matches its constraint (200 per kind, in one request
each), a bad grammar is a 400 naming it, and the engine keeps serving.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re

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
    from relax.backends.hf.tiny_model import build_tiny_bpe_qwen3

    backend, device = request.param.partition("-")[::2]
    model_dir = build_tiny_bpe_qwen3(tmp_path_factory.mktemp("contract-model"), seed=0)
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


# ---- streaming --------------------------------------------------------------------------------
def sse_events(engine, path: str, payload: dict) -> list:
    """POST with `stream: true`; the decoded `data:` events, `[DONE]` kept as the string."""
    import httpx

    events = []
    with httpx.stream("POST", engine.url + path, json=payload, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return events


def test_a_streamed_generate_ends_as_the_same_request_unstreamed(engine):
    """Two prompts x n=2, seeded: per index the events grow the reply token by token (finish_reason
    null until the last), the last event is the unstreamed reply, then [DONE]."""
    request = {"input_ids": [PROMPT, PROMPT[:2]], "return_logprob": True,
               "sampling_params": {"temperature": 1.0, "max_new_tokens": 6, "sampling_seed": 5, "n": 2}}
    plain = call(engine, "generate", request)
    events = sse_events(engine, "/generate", {**request, "stream": True})
    assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
    for index, expected in enumerate(plain):
        mine = [e for e in events[:-1] if e["index"] == index]
        last = mine[-1]
        assert last["output_ids"] == expected["output_ids"] and last["text"] == expected["text"]
        assert last["meta_info"]["finish_reason"] == expected["meta_info"]["finish_reason"]
        logprobs = [lp for lp, _, _ in expected["meta_info"]["output_token_logprobs"]]
        assert [lp for lp, _, _ in last["meta_info"]["output_token_logprobs"]] == pytest.approx(logprobs, abs=1e-5)
        assert all(e["meta_info"]["finish_reason"] is None for e in mine[:-1]) and len(mine) > 1
        for e in mine[:-1]:
            assert expected["output_ids"][:len(e["output_ids"])] == e["output_ids"]
            assert expected["text"].startswith(e["text"])


def test_a_streamed_chat_completion_has_the_same_text_and_usage_last(engine):
    request = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "seed": 3, "temperature": 1.0}
    plain = _post(engine, "/v1/chat/completions", request)
    events = sse_events(engine, "/v1/chat/completions",
                        {**request, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"] == plain["usage"]
    chunks = events[:-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    completion = {"prompt": "hello world", "max_tokens": 6, "seed": 2, "n": 2, "temperature": 1.0}
    plain = _post(engine, "/v1/completions", completion)
    events = sse_events(engine, "/v1/completions", {**completion, "stream": True})
    for choice in plain["choices"]:
        mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert mine[-1]["finish_reason"] == choice["finish_reason"] and events[-1] == "[DONE]"


# ---- constrained decoding ----------------------------------------------------------------------
EMAIL = r"[a-z]{1,6}@[a-z]{1,5}\.(com|org)"
ITEM = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                         "count": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "ok": {"type": "boolean"}},
        "required": ["name", "count", "ok"], "additionalProperties": False}


def samples(engine, constraint: dict, n: int = 200, max_new_tokens: int = 64) -> list[dict]:
    """n samples of PROMPT under one constraint, in one request (n parallel samples, seeded)."""
    replies = call(engine, "generate", {"input_ids": PROMPT, "sampling_params": {
        "temperature": 1.0, "max_new_tokens": max_new_tokens, "sampling_seed": 0, "n": n, **constraint}})
    assert len(replies) == n
    return replies


def test_every_regex_sample_matches(engine):
    replies = samples(engine, {"regex": EMAIL})
    assert all(re.fullmatch(EMAIL, r["text"]) and r["meta_info"]["finish_reason"]["type"] == "stop"
               for r in replies), [r["text"] for r in replies if not re.fullmatch(EMAIL, r["text"])][:5]
    assert len({r["text"] for r in replies}) > 50  # sampled, not one forced string


def test_every_json_schema_sample_is_valid(engine):
    import jsonschema

    replies = samples(engine, {"json_schema": json.dumps(ITEM)})
    for reply in replies:
        jsonschema.validate(json.loads(reply["text"]), ITEM)
        assert reply["meta_info"]["finish_reason"]["type"] == "stop"


def test_ebnf_and_structural_tag_constrain_the_text(engine):
    words = samples(engine, {"ebnf": 'root ::= ("yes" | "no") " " [0-9]'}, n=16, max_new_tokens=16)
    assert all(re.fullmatch(r"(yes|no) [0-9]", r["text"]) for r in words), [r["text"] for r in words]
    tag = {"type": "structural_tag", "triggers": ["<f="],
           "structures": [{"begin": "<f=add>", "schema": ITEM, "end": "</f>"}]}
    bias = {str(t): 5.0 for t in _token_ids(engine, "<f=")}  # a random policy, pushed to open the tag
    replies = samples(engine, {"structural_tag": json.dumps(tag), "logit_bias": bias}, n=16, max_new_tokens=160)
    bodies = [b for r in replies for b in re.findall(r"<f=add>(.*?)</f>", r["text"], re.S)]
    assert bodies and all(json.loads(b).keys() == ITEM["properties"].keys() for b in bodies)


def test_openai_response_format_and_forced_tool_choice(engine):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 160, "seed": 1, "n": 4}
    reply = _post(engine, "/v1/chat/completions", {**chat, "response_format": {
        "type": "json_schema", "json_schema": {"name": "item", "schema": ITEM}}})
    assert all(json.loads(c["message"]["content"]).keys() == ITEM["properties"].keys() for c in reply["choices"])
    tools = [{"type": "function", "function": {"name": "add", "parameters": ITEM}}]
    named = {"type": "function", "function": {"name": "add"}}
    # "required" is a list of calls the policy may extend; a bias on "]" lets a random one close it
    close = {str(t): 6.0 for t in _token_ids(engine, "]")}
    for choice_of_tool, extra in ((named, {}), ("required", {"logit_bias": close})):
        reply = _post(engine, "/v1/chat/completions", {**chat, **extra, "tools": tools, "tool_choice": choice_of_tool})
        for choice in reply["choices"]:
            calls = choice["message"].get("tool_calls")
            assert choice["finish_reason"] == "tool_calls" and calls, choice
            assert all(c["function"]["name"] == "add" and json.loads(c["function"]["arguments"]).keys()
                       == ITEM["properties"].keys() for c in calls)


@pytest.mark.parametrize("params, needle", [
    ({"regex": "[a-"}, "sampling_params.regex: invalid regular expression"),
    ({"json_schema": "{not json"}, "sampling_params.json_schema is not valid JSON"),
    ({"ebnf": "root ::= nowhere"}, "sampling_params.ebnf"),
    ({"structural_tag": '{"triggers": []}'}, "sampling_params.structural_tag must be"),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "give at most one of"),
])
def test_a_bad_grammar_is_a_400_naming_it_and_the_engine_keeps_serving(engine, params, needle):
    with pytest.raises(EngineError) as err:
        call(engine, "generate", {"input_ids": PROMPT, "stream": True, "sampling_params": params})
    assert err.value.status == 400 and needle in str(err.value) and "Traceback" not in str(err.value)
    assert call(engine, "generate", greedy(1))["meta_info"]["completion_tokens"] == 1
    assert call(engine, "health_generate")


def _post(engine, path: str, payload: dict) -> dict:
    import httpx

    reply = httpx.post(engine.url + path, json=payload, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _token_ids(engine, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(engine.model_dir).encode(text, add_special_tokens=False)
