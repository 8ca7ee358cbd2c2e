"""`MCPToolEnv` against real MCP servers (the SDK's own server class, mcp_tool_server.py), over
stdio and streamable HTTP: tool listing and specs, results, images, the model's bad calls as
error observations, a dying server as an environment error; and a multi-turn episode through the
built-in rollout with an in-process hf engine (tool observations with loss mask 0, a server that
dies mid-episode failing only its own sample)."""

from __future__ import annotations

import base64
import io

import pytest
from adapter_services import MCP_STDIO, mcp_http_server, scripted_turns
from agentic_helpers import Traffic, generate, generator, prompt, run

from relax.engine.agentic.adapters.mcp import MCPToolEnv, list_tool_specs
from relax.engine.agentic.env import ENV_ERROR, ENV_TIMEOUT, EnvFailure, call_env
from relax.engine.rollout.prompt_encoding import prompt_ids
from relax.types import Sample


def call(name: str, **arguments) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


async def steps(env: MCPToolEnv, texts: list[str]) -> list[tuple]:
    """reset, then each text as a model turn, then close: as the rollout calls them (call_env)."""
    out = [await call_env(env.reset, timeout=30, what="reset")]
    try:
        for text in texts:
            out.append(await call_env(env.step, text, timeout=30, what="step"))
    finally:
        await call_env(env.close, timeout=30, what="close")
    return out


def test_stdio_server_tools_results_images_and_bad_calls():
    env = MCPToolEnv(command=MCP_STDIO)
    reset, added, bad, malformed, image, final = run(steps(env, [
        call("add", a=2, b=3),
        call("mul", a=2, b=3) + call("add", a="x"),  # an unknown tool and bad arguments, one turn
        "<tool_call>{not json}</tool_call>",
        call("tiny_image", colour="red"),
        "The answer is \\boxed{5}.",
    ]))
    assert reset == ({"obs_str": "", "role": "user"}, {"tools": ["add", "crash", "hang", "tiny_image"]})
    specs = {s["function"]["name"]: s for s in env.tools_for_template()}
    assert specs["add"]["type"] == "function" and specs["add"]["function"]["description"] == "Add two integers."
    assert specs["add"]["function"]["parameters"]["required"] == ["a", "b"]
    assert added == ({"obs_str": "5", "role": "tool"}, False, {"tool_call": 1, "tools": ["add"], "tool_errors": 0})
    obs, done, info = bad
    first, second = obs["obs_str"].split("\n", 1)
    assert first == "error: unknown tool 'mul'; the tools are add, crash, hang, tiny_image"
    assert "validation error" in second  # the server's own message
    assert not done and info == {"tool_call": 2, "tools": ["mul", "add"], "tool_errors": 2}
    assert malformed[0]["obs_str"].startswith("error: the tool call is not JSON") and not malformed[1]
    assert image[0]["obs_str"] == "<image>" and len(image[0]["multi_modal_data"]["image"]) == 1
    assert final == (None, True, {"tool_call": False})  # a turn without a tool call ends the episode
    from PIL import Image

    uri = image[0]["multi_modal_data"]["image"][0]
    assert uri.startswith("data:image/png;base64,")
    pixels = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")
    assert pixels.size == (2, 2) and pixels.getpixel((0, 0)) == (255, 0, 0)


def test_http_server_killed_mid_episode_is_an_env_error_not_a_hang():
    server = mcp_http_server().wait_ready()
    env = MCPToolEnv(url=server.url)

    async def episode():
        specs = await list_tool_specs(url=server.url)  # what data preparation puts in the rows' tools column
        assert [s["function"]["name"] for s in specs] == ["add", "tiny_image", "hang", "crash"]
        await call_env(env.reset, timeout=30, what="reset")
        before = await call_env(env.step, call("add", a=1, b=1), timeout=30, what="step")
        server.kill()
        try:
            with pytest.raises(EnvFailure) as failure:
                await call_env(env.step, call("add", a=2, b=2), timeout=30, what="step")
        finally:
            await call_env(env.close, timeout=30, what="close")
        return before, failure.value

    try:
        before, failure = run(episode())
    finally:
        server.kill()
    assert before[0]["obs_str"] == "2" and failure.kind == ENV_ERROR


def test_a_tool_that_hangs_is_an_env_timeout_and_the_episode_still_closes():
    env = MCPToolEnv(command=MCP_STDIO)

    async def episode():
        await call_env(env.reset, timeout=30, what="reset")
        try:
            with pytest.raises(EnvFailure) as failure:
                await call_env(env.step, call("hang"), timeout=0.5, what="step")
        finally:
            await call_env(env.close, timeout=30, what="close")  # raises EnvFailure if it cannot
        return failure.value

    failure = run(episode())
    assert failure.kind == ENV_TIMEOUT and env._connection is None


def test_an_unreachable_server_fails_reset():
    env = MCPToolEnv(command=["/nonexistent/mcp-server"])
    with pytest.raises(EnvFailure) as failure:
        run(call_env(env.reset, timeout=30, what="reset"))
    assert failure.value.kind == ENV_ERROR and "could not connect" in str(failure.value)


def test_multi_turn_rollout_with_mcp_tools_over_stdio_and_http(engine, mcp_http, monkeypatch):
    """Three samples at once: stdio (one tool call, then the answer), stdio whose server dies at its
    second call, HTTP (an unknown tool, a call, the answer). Tool observations are context (loss
    mask 0) in the template's tool-response turn; the dead server fails its sample only."""
    gen = generator(engine, env="adapter_services.build_mcp_env", max_turns=4, log_trajectories=True)
    samples = [prompt("what is the price of plum", 0), prompt("what is the price of fig", 1),
               prompt("what is the price of kiwi", 2, mcp_url=mcp_http.url)]
    script = [[call("add", a=2, b=3), "The answer is \\boxed{5}."],
              [call("add", a=2, b=3), call("crash")],
              [call("mul", a=4, b=5), call("add", a=4, b=5), "The answer is \\boxed{9}."]]
    keys = [tuple(prompt_ids(gen.tokenizer, s)) for s in samples]
    Traffic(rewrite=scripted_turns(gen.tokenizer, dict(zip(keys, script)))).install(monkeypatch)
    done = generate(gen, samples)
    outcome = [(s.metadata["termination"], s.status, s.metadata["turns"], s.metadata["tool_calls"]) for s in done]
    assert outcome == [("env_done", Sample.Status.COMPLETED, 2, 1), ("env_error", Sample.Status.FAILED, 2, 1),
                       ("env_done", Sample.Status.COMPLETED, 3, 2)]
    assert "Connection closed" in done[1].metadata["env_error"] and not any(done[1].loss_mask)
    tok = gen.tokenizer
    for i in (0, 2):  # completed: the model turns are the engine's ids as they came, the observations mask 0
        runs = _runs(done[i], len(keys[i]))
        assert [tok.decode(ids) for mask, ids in runs if mask] == [t + "<|im_end|>" for t in script[i]]
    observations = [tok.decode(ids) for mask, ids in _runs(done[2], len(keys[2])) if not mask]
    assert observations == [
        "\n<|im_start|>user\n<tool_response>\nerror: unknown tool 'mul'; the tools are add, crash, hang, tiny_image\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "\n<|im_start|>user\n<tool_response>\n9\n</tool_response><|im_end|>\n<|im_start|>assistant\n"]
    assert [e["role"] for e in done[0].metadata["trajectory"]] == ["reset", "assistant", "tool", "assistant"]
    assert done[0].metadata["trajectory"][0]["info"] == {"tools": ["add", "crash", "hang", "tiny_image"]}


def _runs(sample: Sample, prompt_len: int) -> list[tuple[int, list[int]]]:
    """The response as (loss mask, ids) runs: model turns (1) and observations (0)."""
    runs: list[tuple[int, list[int]]] = []
    for tok, mask in zip(sample.tokens[prompt_len:], sample.loss_mask):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(tok)
        else:
            runs.append((mask, [tok]))
    return runs
