"""The multi-turn episode against a real `hf` engine: token-in/token-out, loss masks per turn, every
termination reason, and environment failures and timeouts ending their sample, never the run."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import agentic_envs
import pytest
from agentic_helpers import Traffic, generate, generator, prompt, run

from relax.engine.rollout.generator import StepState
from relax.types import Sample
from relax.utils.net import free_port

EOS = "<|im_end|>"
OBSERVATION = "\n<|im_start|>user\n<tool_response>\nresult {k}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def prompt_ids(gen, sample: Sample) -> list[int]:
    from relax.engine.rollout.prompt_encoding import prompt_ids as encode

    return encode(gen.tokenizer, sample)


def test_sample_tokens_are_the_engine_ids_plus_the_observation_ids(engine, monkeypatch):
    """Every request's input is the sample so far; the sample is the engine's output ids (loss mask 1,
    the engine's log-probs) and the observations' ids from the template's own delimiters (mask 0),
    the newline after <|im_end|> included."""
    traffic = Traffic().install(monkeypatch)
    gen = generator(engine, env="agentic_envs", max_turns=3)
    samples = [prompt("what is the price of plum" + " fig" * i, i, mode="tool") for i in range(3)]
    done = generate(gen, [dataclasses.replace(s) for s in samples])
    tok = gen.tokenizer
    for original, sample in zip(samples, done):
        ids = prompt_ids(gen, original)
        calls = traffic.for_prompt(ids)
        expected, mask, logprobs = list(ids), [], []
        for k, (payload, reply) in enumerate(calls, start=1):
            assert payload["input_ids"] == expected  # token-in: nothing re-tokenized
            out = [int(t) for _, t, _ in reply["meta_info"]["output_token_logprobs"]]
            expected += out
            mask += [1] * len(out)
            logprobs += [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]
            if k < len(calls):
                closed = tok.decode(out[-1:]) == EOS
                obs = tok.encode(("" if closed else EOS) + OBSERVATION.format(k=k), add_special_tokens=False)
                expected += obs
                mask += [0] * len(obs)
                logprobs += [0.0] * len(obs)
        assert len(calls) == 3 and sample.metadata["turns"] == 3 and sample.metadata["termination"] == "max_turns"
        assert sample.tokens == expected and sample.loss_mask == mask and sample.rollout_log_probs == logprobs
        assert sample.response_length == len(expected) - len(ids) == len(mask)
        assert sample.response == tok.decode(expected[len(ids):])
        assert agentic_envs.STEPS[sample.index] == [tok.decode(ids_, skip_special_tokens=True) for ids_ in
                                                    _turns(sample, len(ids))]
    assert sorted(agentic_envs.CLOSED) == [0, 1, 2]  # one environment per sample, each closed once


def _turns(sample: Sample, prompt_len: int) -> list[list[int]]:
    """The model turns' ids (runs of loss mask 1)."""
    turns, current = [], []
    for tok, m in zip(sample.tokens[prompt_len:], sample.loss_mask):
        if m:
            current.append(tok)
        elif current:
            turns, current = turns + [current], []
    return turns + ([current] if current else [])


def test_env_done_max_turns_and_token_budget_end_episodes(engine):
    gen = generator(engine, env="agentic_envs", max_turns=2)
    done = generate(gen, [prompt("what is the price of plum", 0, mode="tool"),
                          prompt("what is the price of fig", 1, mode="done_after", k=1)])
    assert [(s.metadata["termination"], s.metadata["turns"], s.status) for s in done] == [
        ("max_turns", 2, Sample.Status.COMPLETED), ("env_done", 1, Sample.Status.COMPLETED)]
    assert done[0].metadata["tool_calls"] == 2 and done[0].metadata["turn_rewards"] == [0.5, 0.5]
    # --multi-turn-max-tokens 40: turn, observation (30 tokens), turn; the second observation does not fit
    budget = generate(generator(engine, env="agentic_envs", max_turns=5, max_tokens=40),
                      [prompt("what is the price of plum", 0, mode="tool")])[0]
    assert budget.metadata["termination"] == "token_budget" and budget.status == Sample.Status.TRUNCATED
    assert budget.response_length <= 40 and budget.metadata["turns"] == 2 and budget.loss_mask[-1] == 1
    # a turn cut by its own --rollout-max-response-len (no stop): the episode ends there
    cut = generate(generator(engine, env="agentic_envs", short_turns=False, max_new_tokens=3),
                   [prompt("what is the price of plum", 0, mode="tool")])[0]
    assert cut.metadata["termination"] == "token_budget" and cut.response_length == 3 and cut.metadata["turns"] == 1


def test_a_stop_string_in_a_model_turn_ends_the_episode(engine):
    first = generate(generator(engine, env="agentic_envs", max_turns=3),
                     [prompt("what is the price of kiwi", 0, mode="tool")])[0]
    text = agentic_envs.STEPS[0][1]  # the second turn's text (same seed: the same turns again)
    assert text
    again = generate(generator(engine, env="agentic_envs", max_turns=3, stop=(text,)),
                     [prompt("what is the price of kiwi", 0, mode="tool")])[0]
    assert first.metadata["termination"] == "max_turns"
    assert again.metadata["termination"] == "stop" and again.metadata["turns"] == 2
    assert again.status == Sample.Status.COMPLETED


def test_environment_errors_and_timeouts_end_their_sample_not_the_run(engine):
    """Raising, malformed, unbuildable and hung environments (sync and async) each end their own
    sample (status failed, nothing trained on); the healthy sample beside them completes while a
    synchronous step is still blocked in its thread."""
    modes = ["raise_step", "raise_reset", "bad_obs", "tool"]
    gen = generator(engine, env="agentic_envs", max_turns=2)
    hung = generator(engine, env="agentic_envs", env_timeout=0.3)
    hung_async = generator(engine, env="agentic_envs.build_async_env", env_timeout=0.3)
    broken = generator(engine, env="agentic_envs.build_broken_env")

    async def batch():
        step = StepState()
        calls = [gen.generate_one(step, prompt("what is the price of plum", i, mode=m)) for i, m in enumerate(modes)]
        calls += [hung.generate_one(step, prompt("what is the price of fig", 4, mode="hang_step")),
                  hung_async.generate_one(step, prompt("x", 10, mode="hang_step")),
                  broken.generate_one(step, prompt("y", 11))]
        try:
            return await asyncio.gather(*calls)
        finally:
            agentic_envs.RELEASE.set()

    done = run(batch())
    outcome = {s.index: (s.metadata["termination"], s.status) for s in done}
    failed = Sample.Status.FAILED
    assert outcome == {0: ("env_error", failed), 1: ("env_error", failed), 2: ("env_error", failed),
                       3: ("max_turns", Sample.Status.COMPLETED), 4: ("env_timeout", failed),
                       10: ("env_timeout", failed), 11: ("env_error", failed)}
    assert "the tool crashed" in done[0].metadata["env_error"] and "reset broke" in done[1].metadata["env_error"]
    assert "no sandbox available" in done[6].metadata["env_error"] and "--env-timeout" in done[4].metadata["env_error"]
    assert all(not any(s.loss_mask) for s in done if s.status == failed)
    assert done[1].response_length == 0 and done[6].response_length == 0  # no model turn at all
    assert sorted(agentic_envs.CLOSED) == [0, 1, 2, 3, 4, 10]  # every built environment closed once


def test_async_environment_step_rewards_sum_into_the_reward_and_eval_tells_the_env(engine):
    gen = generator(engine, env="agentic_envs.build_async_env", max_turns=4, turn_reward="sum")

    async def group():
        return await gen.generate_group(StepState(), [prompt("what is the price of plum", i) for i in range(2)])

    done = run(group())
    for s in done:
        assert s.metadata["termination"] == "env_done" and s.metadata["turn_rewards"] == [1.0, 1.0]
        assert s.reward == (1.0 if "boxed" in s.response else 0.0) + 2.0  # the score + the step rewards
    assert agentic_envs.EVALUATION == [False, False]
    evaluation = gen.derive(dataclasses.replace(gen.spec, evaluation=True))
    generate(evaluation, [prompt("what is the price of fig", 5)])
    assert agentic_envs.EVALUATION[-1] is True


def test_an_engine_failure_fails_the_call_and_still_closes_the_environment(engine):
    """Not the environment's fault: the error reaches the rollout (as in a single-turn generate), and
    the episode's environment is closed on the way out."""
    gen = generator(engine, env="agentic_envs")
    gen.router_url = f"http://127.0.0.1:{free_port()}/generate"  # nothing listens there
    with pytest.raises(aiohttp.ClientError):
        generate(gen, [prompt("what is the price of plum", 0, mode="tool")])
    assert agentic_envs.CLOSED == [0]
