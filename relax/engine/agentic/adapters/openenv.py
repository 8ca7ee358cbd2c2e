"""An OpenEnv environment server as a `BaseInteractionEnv`, through `openenv-core`'s client.

OpenEnv serves an `Environment` (reset / step / state) over HTTP; an episode is a session on the
server's `/ws` endpoint, which `openenv.core.EnvClient` holds (one environment instance per
session, server side). Per episode:

    reset()      connect, `client.reset(**reset_kwargs)`     -> (the first observation, {"reward": ...})
    step(text)   `action_from_text(text)` -> `client.step(action)`
                                                             -> (observation, result.done, {"reward": result.reward})
    close()      `client.close()` (ends the server's session)

- **Client**: a URL (`http://host:port`) gets `GenericEnvClient` (actions and observations are
  plain dicts); or pass the environment's own typed client (`MyEnv(base_url=...)`, an `EnvClient`
  subclass) and an `action_from_text` that builds its `Action`.
- **Action**: `action_from_text(text)`; the default makes `{action_field: text}` (`"message"`: the
  action field of `openenv init`'s template and the echo environment). It may raise `ValueError`
  for text that is no action: the model is told (an error observation) and the episode goes on; so
  it does when the server rejects the action (its validation error): a bad action is the policy's.
- **Observation**: the result's observation (a dict, or a pydantic model dumped without
  reward/done/metadata) -> `observation_to_text(fields)`; the default takes the only string field,
  or a usual one (`TEXT_FIELDS`), else the fields as JSON. Fields named in `image_fields`
  (a data URI, path or URL, or a list of them) become `multi_modal_data["image"]`.
- **Failures**: a server that cannot be reached, that errors while stepping, or whose connection
  drops raises (the rollout ends the sample `env_error`; `--env-timeout` bounds each call).

The reset observation is recorded, not tokenized (env.py): a task the environment states at reset
must also be in the row's prompt. The environment's step rewards are `metadata["turn_rewards"]`;
`--turn-reward sum` adds them to the reward function's score.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from relax.engine.agentic.env import BaseInteractionEnv, Observation

try:
    from openenv.core import GenericEnvClient
except ImportError as exc:  # the `agents` extra
    raise ImportError("relax.engine.agentic.adapters.openenv needs OpenEnv's client: pip install "
                      "'relax-rl[agents]' (or pip install openenv-core)") from exc

TEXT_FIELDS = ("text", "message", "echoed_message", "prompt", "output", "stdout", "content", "observation")
IMAGE_FIELDS = ("image", "images", "screenshot")
INVALID_ACTION = "VALIDATION_ERROR"  # the server's error code for an action its Action model rejects


def text_action(field: str = "message") -> Callable[[str], dict[str, Any]]:
    """`action_from_text` for an environment whose action is one text field."""
    return lambda text: {field: text}


class OpenEnvEnv(BaseInteractionEnv):
    """One episode on an OpenEnv server (module doc)."""

    def __init__(self, client: Any, *, action_from_text: Callable[[str], Any] | None = None,
                 action_field: str = "message", observation_to_text: Callable[[dict[str, Any]], str] | None = None,
                 image_fields: tuple[str, ...] = IMAGE_FIELDS, reset_kwargs: dict[str, Any] | None = None,
                 role: str = "user", connect_timeout_s: float = 10.0) -> None:
        if isinstance(client, str):
            client = GenericEnvClient(base_url=client, connect_timeout_s=connect_timeout_s)
        if not all(callable(getattr(client, m, None)) for m in ("reset", "step", "close")):
            raise TypeError(f"OpenEnvEnv takes a server URL or an openenv EnvClient, got {type(client).__name__}")
        self.client = client
        self.action_from_text = action_from_text or text_action(action_field)
        self.observation_to_text = observation_to_text or default_text
        self.image_fields, self.role = image_fields, role
        self.reset_kwargs = dict(reset_kwargs or {})

    async def reset(self) -> tuple[Observation, dict[str, Any]]:
        result = await self.client.reset(**self.reset_kwargs)
        return self.observation(result.observation), _info(result)

    async def step(self, response_text: str) -> tuple[Observation | None, bool, dict[str, Any]]:
        try:
            action = self.action_from_text(response_text)
        except ValueError as exc:  # the text is no action (a pydantic ValidationError is a ValueError)
            return self.invalid(exc)
        try:
            result = await self.client.step(action)
        except RuntimeError as exc:  # EnvClient's "Server error: <message> (code: <code>)"
            if f"(code: {INVALID_ACTION})" not in str(exc):
                raise
            return self.invalid(exc)  # the server's Action model rejects it
        return self.observation(result.observation), bool(result.done), _info(result)

    async def close(self) -> None:
        await self.client.close()

    def observation(self, observation: Any) -> Observation:
        """The server's observation as the rollout's: text, and image fields as media."""
        fields = _fields(observation)
        images = [item for name in self.image_fields for item in _items(fields.pop(name, None))]
        out: Observation = {"obs_str": self.observation_to_text(fields), "role": self.role}
        if images:
            out["multi_modal_data"] = {"image": images}
        return out

    def invalid(self, exc: Exception) -> tuple[Observation, bool, dict[str, Any]]:
        return {"obs_str": f"invalid action: {exc}", "role": self.role}, False, {"invalid_action": True}


def default_text(fields: dict[str, Any]) -> str:
    """The only string field, else the first usual text field, else the fields as JSON."""
    strings = [value for value in fields.values() if isinstance(value, str)]
    if len(strings) == 1:
        return strings[0]
    for name in TEXT_FIELDS:
        if isinstance(fields.get(name), str):
            return fields[name]
    return json.dumps(fields, default=str, sort_keys=True)


def _fields(observation: Any) -> dict[str, Any]:
    if hasattr(observation, "model_dump"):  # a typed client's Observation model
        return observation.model_dump(exclude={"reward", "done", "metadata"})
    if not isinstance(observation, dict):
        raise ValueError(f"an OpenEnv observation is a dict or a pydantic model, got {type(observation).__name__}")
    return dict(observation)


def _items(value: Any) -> list[Any]:
    if value is None or value == "" or value == []:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _info(result: Any) -> dict[str, Any]:
    return {} if result.reward is None else {"reward": float(result.reward)}
