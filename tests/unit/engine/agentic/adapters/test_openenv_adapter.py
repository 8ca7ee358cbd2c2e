"""`OpenEnvEnv` against real OpenEnv servers (openenv-core's `create_fastapi_app` serving an
`Environment`, openenv_word_server.py): observations, rewards and done flow through, image fields
become media, invalid actions are the model's to read; and episodes through the built-in rollout
with an in-process hf engine, where the server that dies mid-episode fails only its own sample."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from agentic_helpers import generate, generator, prompt, run

from relax.engine.agentic.adapters.openenv import OpenEnvEnv
from relax.engine.agentic.env import ENV_ERROR, EnvFailure, call_env
from relax.types import Sample
from relax.utils.net import free_port


async def episode(env: OpenEnvEnv, texts: list[str]) -> list[tuple]:
    """reset, each text as a model turn, close: as the rollout calls them (call_env)."""
    out = [await call_env(env.reset, timeout=30, what="reset")]
    try:
        for text in texts:
            out.append(await call_env(env.step, text, timeout=30, what="step"))
    finally:
        await call_env(env.close, timeout=30, what="close")
    return out


def test_observations_rewards_and_done_flow_through(openenv_servers):
    healthy, _ = openenv_servers
    reset, first, second, third = run(episode(OpenEnvEnv(healthy.url, reset_kwargs={"seed": 7}),
                                              ["hello", "", "goodbye"]))
    (image,) = reset[0].pop("multi_modal_data")["image"]  # the observation's image field, a data URI
    assert reset == ({"obs_str": "say words (seed 7)", "role": "user"}, {})
    assert Image.open(io.BytesIO(base64.b64decode(image.removeprefix("data:image/png;base64,")))).size == (1, 1)
    assert first == ({"obs_str": "echo 1: hello", "role": "user"}, False, {"reward": 0.5})
    assert second == ({"obs_str": "echo 2: ", "role": "user"}, False, {"reward": 0.0})
    assert third == ({"obs_str": "echo 3: goodbye", "role": "user"}, True, {"reward": 0.7})


def test_an_invalid_action_is_an_observation_and_the_episode_goes_on(openenv_servers):
    healthy, _ = openenv_servers

    def action(text: str) -> dict:
        if not text:
            raise ValueError("say something")
        return {"message": text} if text != "wrong field" else {"msg": text}  # the server rejects "msg"

    _, empty, rejected, ok = run(episode(OpenEnvEnv(healthy.url, action_from_text=action),
                                         ["", "wrong field", "fine"]))
    assert empty == ({"obs_str": "invalid action: say something", "role": "user"}, False, {"invalid_action": True})
    assert rejected[0]["obs_str"].startswith("invalid action: ") and rejected[2] == {"invalid_action": True}
    assert ok == ({"obs_str": "echo 1: fine", "role": "user"}, False, {"reward": 0.4})  # the session lives on


def test_an_unreachable_server_fails_reset():
    env = OpenEnvEnv(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    with pytest.raises(EnvFailure) as failure:
        run(call_env(env.reset, timeout=30, what="reset"))
    assert failure.value.kind == ENV_ERROR and "ConnectionError" in str(failure.value)


def test_multi_turn_rollout_on_openenv_and_a_server_killed_mid_episode(engine, openenv_servers):
    """Two samples on a healthy server end when the environment says done (step 3), their step
    rewards recorded and the observations context (loss mask 0); the third's server process dies
    in its second step: that sample fails (env_error, nothing trained on), the others complete."""
    healthy, dying = openenv_servers
    gen = generator(engine, env="adapter_services.build_openenv_env", max_turns=5, log_trajectories=True)
    done = generate(gen, [prompt("what is the price of plum", 0, openenv_url=healthy.url),
                          prompt("what is the price of fig", 1, openenv_url=healthy.url),
                          prompt("what is the price of kiwi", 2, openenv_url=dying.url)])
    assert [(s.metadata["termination"], s.status, s.metadata["turns"]) for s in done] == [
        ("env_done", Sample.Status.COMPLETED, 3), ("env_done", Sample.Status.COMPLETED, 3),
        ("env_error", Sample.Status.FAILED, 2)]
    assert not any(done[2].loss_mask) and "step raised" in done[2].metadata["env_error"]
    for sample in done[:2]:
        trajectory = sample.metadata["trajectory"]
        turns = [e["text"] for e in trajectory if e["role"] == "assistant"]
        observations = [e for e in trajectory if e["role"] == "user"]
        assert sample.metadata["turn_rewards"] == [len(t) / 10 for t in turns]  # the server's rewards
        assert [o["text"] for o in observations] == [f"echo {k}: {t}" for k, t in enumerate(turns[:2], start=1)]
        observed = sum(o["tokens"] for o in observations)
        assert sample.loss_mask.count(0) == observed > 0 and sample.response_length == len(sample.loss_mask)
    assert done[0].metadata["trajectory"][0] == {"role": "reset", "text": "say words (seed 0)", "info": {}}
