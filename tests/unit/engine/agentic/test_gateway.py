"""The agent gateway (relax.engine.agentic.gateway*, agent.py): a real `openai` client against the
real gateway over HTTP, the tiny `hf` engine in-process (or a scripted engine where the test needs
a tool call the random model would not write)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from agentic_agents import TOOL_RESULT, TOOLS
from agentic_helpers import TEMPERATURE, FakeRewards, prompt, run
from openai import AsyncOpenAI

from relax.engine.agentic import gateway_session
from relax.engine.agentic.gateway import close_gateways, gateway_for
from relax.engine.agentic.gateway_protocol import MAX_BODY_BYTES, parse_tool_calls
from relax.engine.agentic.gateway_session import RunContext
from relax.engine.agentic.observation import ObservationEncoder
from relax.engine.agentic.records import multi_turn_metrics
from relax.engine.agentic import episode_generate
from relax.engine.rollout.generator import Generator, StepState
from relax.distributed.transfer_queue import MAX_SEGMENTS, SEGMENT_KEY_BASE, episode_rows
from relax.engine.specs import AgenticSpec, RolloutSpec, SamplingSpec
from relax.types import Sample
from relax.utils.plugins import PluginError

AGENT = "agentic_agents.scripted"
CALL_TEXT = '<tool_call>\n{"name": "lookup", "arguments": {"item": "plum"}}\n</tool_call>'
ANSWER_TEXT = "The price is \\boxed{7}."


def play(gen: Any, samples: list[Sample]) -> list[Sample]:
    """`samples` through the generator's per-sample path, concurrently; the gateway closed after."""
    async def go() -> list[Sample]:
        try:
            return list(await asyncio.gather(*(gen.generate_one(StepState(), s) for s in samples)))
        finally:
            await close_gateways()

    return run(go())


def outputs(reply: dict) -> list[int]:
    return [int(t) for _, t, *_ in reply["meta_info"]["output_token_logprobs"]]


@pytest.fixture()
def traffic(monkeypatch) -> list[tuple[dict, dict]]:
    """Every /generate payload and reply of the gateway."""
    calls, real = [], gateway_session.post

    async def post(url: str, payload: dict, **kw: Any) -> Any:
        reply = await real(url, payload, **kw)
        calls.append((payload, reply))
        return reply

    monkeypatch.setattr(gateway_session, "post", post)
    return calls


@pytest.fixture()
def scripted_engine(monkeypatch, engine) -> list[dict]:
    """The gateway's engine replaced by one that writes CALL_TEXT, then ANSWER_TEXT, alternately (each
    closed by <|im_end|>, log-prob -0.5, weight version 3); returns the payloads it got."""
    tok, payloads = engine.engine.tokenizer, []
    end = tok.convert_tokens_to_ids("<|im_end|>")

    async def post(url: str, payload: dict, **kw: Any) -> Any:
        payloads.append(payload)
        ids = tok.encode((CALL_TEXT, ANSWER_TEXT)[(len(payloads) - 1) % 2], add_special_tokens=False) + [end]
        return {"text": "", "meta_info": {"output_token_logprobs": [[-0.5, t, None] for t in ids],
                                          "finish_reason": {"type": "stop"}, "weight_version": "3"}}

    monkeypatch.setattr(gateway_session, "post", post)
    return payloads


def run_context(engine: Any) -> RunContext:
    tok = engine.engine.tokenizer
    return RunContext(tokenizer=tok, url=f"{engine.url}/generate", http_timeout=30.0, max_context_len=None,
                      observations=ObservationEncoder(tok))


def agent_generator(engine: Any, *, context_len: int | None = 512, agent: str = AGENT, **agentic: Any) -> Generator:
    """A Generator whose samples are agentic_agents.scripted's episodes (turns of a token or few, as
    agentic_helpers.generator makes them); `context_len` None: no context limit (a scripted engine)."""
    sampling = SamplingSpec(temperature=TEMPERATURE, max_new_tokens=6, max_context_len=context_len,
                            stop_token_ids=tuple(range(10, engine.engine.vocab_size)))
    spec = RolloutSpec(batch_size=1, n_samples_per_prompt=1, sampling=sampling, seed=7,
                       agentic=AgenticSpec(agent_path=agent, **agentic))
    return Generator(spec, tokenizer=engine.engine.tokenizer, router_url=f"{engine.url}/generate",
                     rewards=FakeRewards(), plugin_args=None, episodes=episode_generate)


async def with_session(engine: Any, body: Any) -> Any:
    """`await body(gateway, session)` on a fresh gateway, closed after."""
    gateway = await gateway_for()
    try:
        return await body(gateway, gateway.open(run_context(engine), {"temperature": 1.0, "max_new_tokens": 24}))
    finally:
        await close_gateways()


def test_recorded_ids_are_the_engines_ids_across_tool_turns(engine, traffic):
    tok = engine.engine.tokenizer
    gen = agent_generator(engine, log_trajectories=True)
    samples = play(gen, [prompt("price of plum", 0, mode="tools"), prompt("what is fig", 1, mode="tools_dump")])
    tool_ids = ObservationEncoder(tok)
    for s in samples:
        start = len(s.tokens) - s.response_length
        mine = [(p, r) for p, r in traffic if p["input_ids"][:start] == s.tokens[:start]]
        assert len(mine) == 3 and s.metadata["turns"] == 3 and s.metadata["agent_segments"] == 1
        mask, log_probs = [0] * s.response_length, [0.0] * s.response_length
        for i, (payload, reply) in enumerate(mine):
            head = payload["input_ids"] + outputs(reply)
            for k, (lp, _, *_) in enumerate(reply["meta_info"]["output_token_logprobs"]):
                mask[len(payload["input_ids"]) - start + k], log_probs[len(payload["input_ids"]) - start + k] = 1, lp
            if i + 1 < len(mine):  # the next request: this one + the engine's ids + the tool turn's template ids
                nxt = mine[i + 1][0]["input_ids"]
                tool = tok.encode(tool_ids.messages_text([{"role": "tool", "content": TOOL_RESULT}], head[-1]),
                                  add_special_tokens=False)
                assert nxt == head + tool
        assert s.tokens == mine[-1][0]["input_ids"] + outputs(mine[-1][1])  # no drift at any boundary
        assert s.loss_mask == mask and s.rollout_log_probs == pytest.approx(log_probs)
        assert len(s.weight_versions) == 3 and s.session_id
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        assert s.metadata["agent_return"] == {"calls": 3, "evaluation": False}


def test_tool_calls_are_parsed_and_the_next_call_continues_the_engines_tokens(engine, scripted_engine):
    tok = engine.engine.tokenizer
    messages: list[Any] = [{"role": "user", "content": "price of plum"}]

    async def body(gateway, session):
        async with AsyncOpenAI(base_url=gateway.base_url(session), api_key=session.key, max_retries=0) as client:
            first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            messages.extend([first.choices[0].message, {"role": "tool", "tool_call_id": "c", "content": "plum: 7"}])
            second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return first, second, session

    first, second, session = run(with_session(engine, body))
    call = first.choices[0]
    assert call.finish_reason == "tool_calls" and call.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in call.message.tool_calls] == [
        ("lookup", {"item": "plum"})]
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == ANSWER_TEXT
    (segment,) = session.segments  # the second call extended the first
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call_ids = tok.encode(CALL_TEXT, add_special_tokens=False) + [end]
    answer_ids = tok.encode(ANSWER_TEXT, add_special_tokens=False) + [end]
    p0, p1 = scripted_engine[0]["input_ids"], scripted_engine[1]["input_ids"]
    assert p1[:len(p0) + len(call_ids)] == p0 + call_ids  # the engine's ids, as they were
    gap = p1[len(p0) + len(call_ids):]
    assert tok.decode(gap).startswith("\n<|im_start|>user\n<tool_response>")  # the model's <|im_end|> closed its turn
    assert segment.tokens == p1 + answer_ids and segment.prompt_length == len(p0)
    assert segment.loss_mask == [1] * len(call_ids) + [0] * len(gap) + [1] * len(answer_ids)
    assert segment.log_probs == [-0.5] * len(call_ids) + [0.0] * len(gap) + [-0.5] * len(answer_ids)
    assert segment.weight_versions == [3, 3] and second.usage.prompt_tokens == len(p1)


def test_declared_tools_are_parsed_without_their_schema_in_the_prompt(engine, scripted_engine):
    tok = engine.engine.tokenizer
    messages = [{"role": "user", "content": "price of plum"}]

    async def body(gateway, session):
        session.ctx.tools_in_prompt = False  # --agent-tools-in-prompt false
        async with AsyncOpenAI(base_url=gateway.base_url(session), api_key=session.key, max_retries=0) as client:
            return await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)

    reply = run(with_session(engine, body))
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["lookup"]
    bare = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert scripted_engine[0]["input_ids"] == tok.encode(bare, add_special_tokens=False)


def test_streaming_returns_what_a_plain_call_returns(engine, scripted_engine):
    async def body(gateway, session):
        async with AsyncOpenAI(base_url=gateway.base_url(session), api_key=session.key, max_retries=0) as client:
            plain = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}],
                                                         tools=TOOLS)
            scripted_engine.clear()  # the same scripted reply again
            stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}],
                                                          tools=TOOLS, stream=True)
            chunks = [chunk async for chunk in stream]
        return plain, chunks

    plain, chunks = run(with_session(engine, body))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    message = plain.choices[0].message
    assert text == (message.content or "") and finish == [plain.choices[0].finish_reason] == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls]


def test_bad_requests_are_refused_and_the_gateway_serves_on(engine, scripted_engine):
    good = {"messages": [{"role": "user", "content": "hi"}]}

    async def body(gateway, session):
        url, auth = gateway.base_url(session), {"Authorization": f"Bearer {session.key}"}
        async with httpx.AsyncClient(timeout=30) as http:
            async def status(body: Any = None, headers: Any = auth, path: str = "/chat/completions",
                             base: str = url, raw: bytes | None = None) -> tuple[int, str]:
                r = await http.post(base + path, headers=headers, content=raw if raw is not None else json.dumps(body))
                return r.status_code, (r.json().get("error") or {}).get("message", "") if r.status_code >= 400 else ""

            got = [await status(good, headers={}), await status(good, headers={"Authorization": "Bearer nope"}),
                   await status(good, base=url.replace(session.id, "0" * 32)), await status(raw=b"{not json"),
                   await status({"messages": []}), await status({**good, "temperature": -1}),
                   await status({**good, "n": 2}), await status({**good, "tool_choice": "required"}),
                   await status({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
                   await status(raw=b" " * (MAX_BODY_BYTES + 1))]
            models = await http.get(url + "/models", headers=auth)
            no_key_models = await http.get(url + "/models")
            after = await http.post(url + "/chat/completions", headers=auth, json=good)
        async with AsyncOpenAI(base_url=url, api_key="wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(model="m", messages=good["messages"])
        return got, models, no_key_models, after, gateway.bad_requests

    got, models, no_key_models, after, refused = run(with_session(engine, body))
    assert [code for code, _ in got] == [401, 401, 404, 400, 400, 400, 400, 400, 400, 413]
    fields = [message.split(":")[0] for _, message in got[3:9]]
    assert fields == ["body", "messages", "temperature", "n", "tool_choice", "messages.0.content"]
    assert models.status_code == 200 and models.json()["data"][0]["object"] == "model"
    assert no_key_models.status_code == 401 and refused == 12
    assert after.status_code == 200 and "lookup" in after.json()["choices"][0]["message"]["content"]  # no tools: text


@pytest.mark.parametrize("train_segments", [False, True], ids=["last", "all"])
def test_a_rewritten_history_starts_a_new_segment(engine, scripted_engine, train_segments):
    """The last segment is the sample; the earlier one rides in prior_segments (--agent-segments all)
    and becomes a row of its own that shares the episode's reward, group and episode index."""
    tok = engine.engine.tokenizer
    gen = agent_generator(engine, context_len=None, train_segments=train_segments)  # (a long tools schema)
    (s,) = play(gen, [prompt("price of plum", 0, mode="rewrite", with_tools=True)])
    untrained = 0 if train_segments else 2
    assert (s.metadata["agent_segments"], s.metadata["agent_untrained_calls"], s.metadata["turns"]) == (2, untrained, 3)
    last = scripted_engine[2]["input_ids"]  # the third call: the rewritten conversation, rendered whole
    assert tok.decode(last).startswith("<|im_start|>system\nsummary: plum")
    assert s.tokens[:len(s.tokens) - s.response_length] == last
    assert s.loss_mask == [1] * s.response_length and s.status == Sample.Status.COMPLETED
    assert s.metadata["tool_calls"] == 2  # the scripted engine's two tool calls (the third call answered)
    if not train_segments:
        assert s.prior_segments == []
        return
    (seg,) = s.prior_segments  # the first two calls: the first prompt, then each call's ids
    first = scripted_engine[0]["input_ids"]
    assert seg.tokens[:len(seg.tokens) - seg.response_length] == first
    assert seg.tokens[len(first):len(first) + len(outputs_of(tok, 0))] == outputs_of(tok, 0)
    assert seg.status == Sample.Status.COMPLETED and seg.weight_versions == [3, 3]
    trained = [t for t, m in zip(seg.tokens[len(first):], seg.loss_mask) if m]
    assert trained == outputs_of(tok, 0) + outputs_of(tok, 1)  # the engine's completions only
    assert seg.rollout_log_probs.count(-0.5) == len(trained)
    s.reward = 1.0
    rows, rewards, episodes = episode_rows([s], [1.0])
    assert [r.index for r in rows] == [SEGMENT_KEY_BASE + s.index * MAX_SEGMENTS, s.index]
    assert rewards == [1.0, 1.0] and episodes == [(s.index, 2), (s.index, 2)] and rows[0].group_index == s.group_index
    assert Sample.from_dict(s.to_dict()).prior_segments[0].tokens == seg.tokens  # saved rollouts keep them


def outputs_of(tok: Any, call: int) -> list[int]:
    """The scripted engine's completion ids for its `call`-th reply (CALL_TEXT, ANSWER_TEXT alternately)."""
    return tok.encode((CALL_TEXT, ANSWER_TEXT)[call % 2], add_special_tokens=False) + [
        tok.convert_tokens_to_ids("<|im_end|>")]


def test_an_agent_that_raises_hangs_or_never_calls_fails_only_its_sample(engine):
    gen = agent_generator(engine, agent_timeout=1.0)
    modes = ["raise", "hang", "none", "tools"]
    samples = play(gen, [prompt("price of plum", i, mode=m) for i, m in enumerate(modes)])
    by_mode = dict(zip(modes, samples))
    for mode, termination in (("raise", "agent_error"), ("hang", "agent_timeout"), ("none", "agent_error")):
        s = by_mode[mode]
        assert s.status == Sample.Status.FAILED and s.metadata["termination"] == termination
        assert s.loss_mask == [0] * s.response_length
    assert "RuntimeError: agent broke" in by_mode["raise"].metadata["agent_error"]
    assert by_mode["raise"].response_length > 0  # its one call is kept, not trained on
    assert "--agent-timeout 1" in by_mode["hang"].metadata["agent_error"]
    assert "without calling the model" in by_mode["none"].metadata["agent_error"]
    assert by_mode["tools"].status != Sample.Status.FAILED and by_mode["tools"].metadata["turns"] == 3
    metrics = multi_turn_metrics(samples, "rollout")
    assert metrics["rollout/multi_turn/agent_errors"] == 3.0 and metrics["rollout/termination/agent_timeout"] == 0.25
    assert metrics["rollout/multi_turn/turns_mean"] == (1 + 1 + 0 + 3) / 4


def test_the_agent_plugin_is_checked_when_the_generator_is_built(engine):
    with pytest.raises(PluginError, match="--agent-function-path.*not an async function"):
        agent_generator(engine, agent="agentic_agents.not_async")


def test_tool_call_parsing_keeps_a_malformed_call_as_text():
    assert parse_tool_calls("no call") == ("no call", [])
    assert parse_tool_calls("<tool_call>{oops</tool_call>") == ("<tool_call>{oops</tool_call>", [])
    content, calls = parse_tool_calls('ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    assert content == "ok" and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("f", '{"a": 1}')]
