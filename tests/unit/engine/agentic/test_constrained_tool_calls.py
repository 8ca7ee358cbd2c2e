"""Tool calls of a model turn (`relax.engine.agentic.tool_calls`), and the multi-turn rollout's
tool-call constraint (`--multi-turn-constrain-tool-calls`): with it a tiny random policy's calls
always parse; without it they mostly do not (so the test can fail)."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentic_helpers import EngineServer, generator, prompt, run

from relax.engine.agentic.episode import Episode
from relax.engine.agentic.rollout import EpisodeContext
from relax.engine.agentic.tool_calls import parse_tool_calls, tool_call_tag

LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"item": {"type": "string", "enum": ["plum", "fig"]}}, "required": ["item"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def free_engine(text_model_dir, one_thread):
    """An engine without true on-policy numerics (constraints are refused under them)."""
    server = EngineServer(text_model_dir, dtype="float32")
    yield server
    server.close()


def test_tool_call_tag_is_sglangs_structural_tag_for_each_tool():
    tag = json.loads(tool_call_tag([LOOKUP]))
    assert tag["triggers"] == ["<tool_call>"]
    assert tag["structures"] == [{"begin": '<tool_call>\n{"name": "lookup", "arguments": ',
                                  "schema": LOOKUP["function"]["parameters"], "end": "}\n</tool_call>"}]
    assert json.loads(tool_call_tag(None))["structures"][0]["begin"] == "<tool_call>\n"
    with pytest.raises(ValueError, match="a tool is"):
        tool_call_tag([{"name": 3}])


def _turns(server: EngineServer, constrain: bool, samples: int = 8) -> list[str]:
    """One model turn per sample (concurrent: one batch), the policy pushed to write calls (a bias on
    `<tool_call>` and `</tool_call>`)."""
    gen = generator(server, env="agentic_envs", short_turns=False, constrain_tool_calls=constrain)
    ctx = EpisodeContext.of(gen, None)
    tags = server.engine.tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])

    async def turn(i: int) -> str:
        sample = prompt("what is the price of plum", i, tools=[LOOKUP])
        ids, _ = await ctx.encoder.encode(sample)
        sample.tokens, sample.loss_mask, sample.rollout_log_probs = list(ids), [], []
        episode = Episode(env=None, media=None, prompt_length=len(ids))
        params = {"temperature": 1.0, "max_new_tokens": 96, "sampling_seed": i,
                  "logit_bias": {str(t): 6.0 for t in tags}}
        await ctx.model_turn(episode, sample, params)
        return ctx.decode(sample.tokens[len(ids):])

    async def go() -> list[str]:
        return list(await asyncio.gather(*(turn(i) for i in range(samples))))
    return run(go())


def test_with_the_constraint_every_tool_call_of_a_tiny_policy_parses(free_engine):
    texts = _turns(free_engine, constrain=True)
    calls = [call for text in texts for call in parse_tool_calls(text)]
    assert calls, texts  # the policy did call
    assert all(c.error is None and c.name == "lookup" and c.arguments["item"] in ("plum", "fig") for c in calls), texts


def test_without_it_the_same_policys_calls_are_malformed(free_engine):
    calls = [call for text in _turns(free_engine, constrain=False) for call in parse_tool_calls(text)]
    assert calls and not any(c.error is None for c in calls)
