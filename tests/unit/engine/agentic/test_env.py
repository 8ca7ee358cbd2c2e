"""The environment interface without an engine: observations as chat messages, how calls are made
(sync in a thread, async on the loop, bounded, failures as EnvFailure), and loading build_env."""

from __future__ import annotations

import asyncio
import threading

import pytest

from relax.engine.agentic.env import (
    ENV_ERROR, ENV_TIMEOUT, BaseInteractionEnv, EnvFailure, as_step, call_env, load_env_factory, observation_parts,
)
from relax.utils.plugins import PluginError


def test_observation_parts_put_media_at_their_placeholders_and_the_rest_first():
    parts = observation_parts({"obs_str": "left <image> right", "multi_modal_data": {"image": ["A", "B"]}})
    assert parts == [{"type": "image", "image": "A"}, {"type": "text", "text": "left "},
                     {"type": "image", "image": "B"}, {"type": "text", "text": " right"}]
    assert observation_parts({"obs_str": "plain"}) == [{"type": "text", "text": "plain"}]
    with pytest.raises(ValueError, match="unknown kinds"):
        observation_parts({"obs_str": "", "multi_modal_data": {"pdf": [1]}})


def test_the_default_format_observation_is_a_chat_message_with_a_known_role():
    class Env(BaseInteractionEnv):
        def reset(self):
            return {}, {}

        def step(self, response_text):
            return None, True, {}

    env = Env()
    assert env.format_observation({"obs_str": "7", "role": "tool"}) == {
        "role": "tool", "content": [{"type": "text", "text": "7"}]}
    assert env.format_observation({"obs_str": "x", "role": "robot"})["role"] == "user"
    env.close()  # a no-op by default
    with pytest.raises(TypeError):
        BaseInteractionEnv()  # reset and step are abstract


def test_call_env_runs_sync_calls_in_a_thread_and_async_ones_on_the_loop():
    loop_thread = []

    def sync(x):
        return x + 1, threading.current_thread() is not loop_thread[0]

    async def coro(x):
        return x * 2

    async def main():
        loop_thread.append(threading.current_thread())
        return (await call_env(sync, 1, timeout=5, what="step"), await call_env(coro, 3, timeout=5, what="step"))

    assert asyncio.run(main()) == ((2, True), 6)


def test_call_env_turns_errors_and_timeouts_into_env_failures():
    def broken():
        raise KeyError("missing tool")

    async def slow():
        await asyncio.Event().wait()

    async def main(fn, timeout):
        with pytest.raises(EnvFailure) as failure:
            await call_env(fn, timeout=timeout, what="step")
        return failure.value

    error = asyncio.run(main(broken, 5))
    assert error.kind == ENV_ERROR and "step raised KeyError" in str(error)
    timeout = asyncio.run(main(slow, 0.05))
    assert timeout.kind == ENV_TIMEOUT and "--env-timeout 0.05" in str(timeout)


def test_step_results_are_checked():
    assert as_step(("7", False, None)) == ({"obs_str": "7", "role": "user"}, False, {})
    with pytest.raises(EnvFailure, match="must return"):
        as_step(({"obs_str": "7"}, False))
    with pytest.raises(EnvFailure, match="bad value"):
        as_step(({"obs_str": 7}, False, {}))


def test_load_env_factory_takes_a_module_or_the_factory_and_checks_its_keywords():
    assert load_env_factory("agentic_envs").__name__ == "build_env"
    assert load_env_factory("agentic_envs.build_async_env").__name__ == "build_async_env"
    with pytest.raises(PluginError, match="--rollout-interaction-env-path"):
        load_env_factory("agentic_envs.ScriptedEnv.step")  # no sample=/args= keywords
    with pytest.raises(PluginError, match="no build_env"):
        load_env_factory("agentic_helpers")
