"""The environment interface of multi-turn rollouts (the seeds' `BaseInteractionEnv`) and how the
rollout calls it: off the event loop, bounded in time, failures turned into a recorded outcome.

An environment is a stateful object, one per sample, made by its module's factory
`build_env(sample=..., args=...)` (the module is `--rollout-interaction-env-path`):

    reset() -> (observation, info)              before the first model turn
    step(response_text) -> (observation, done, info)   after each model turn
    format_observation(observation) -> chat message    {"role": ..., "content": str | [parts]}
    close()                                     when the episode ends, however it ends

An observation is `{"obs_str": str, "role": "user" | "tool" | ..., "multi_modal_data": {"image": [...]}}`
(a bare string means `{"obs_str": s, "role": "user"}`). Each method may be `async def`. What a
step's `info` may carry that the rollout reads: `reward` (a per-step reward, see `turn_reward`),
`tool_call` (bool or a count: the turn called a tool; without it a step that is not `done` counts
as one tool call). The reset observation is recorded, not tokenized: the row's prompt is the first
observation the model sees.

`BaseInteractionEnv` is a base to subclass as the seeds show (`reset`/`step` are abstract,
`format_observation` and `close` have defaults); any object with those methods works as well.
`call_env` runs one call: coroutines on the loop, plain functions in a worker thread (a slow or
hung environment never stalls the other samples), both bounded by `--env-timeout`; a call that
raises or times out becomes an `EnvFailure`, which ends its sample, never the run. (A hung
synchronous call's thread cannot be stopped; it is abandoned.)
"""

from __future__ import annotations

import abc
import asyncio
import functools
import inspect
import re
from typing import Any, Callable, TypedDict

from relax.utils.data.formatting import MULTIMODAL_PLACEHOLDERS
from relax.utils.plugins import accepts_keyword, load_factory

ROLES = ("user", "assistant", "tool", "system")
ENV_ERROR, ENV_TIMEOUT = "env_error", "env_timeout"
BUILD_ENV_SIGNATURE = "build_env(sample=..., args=...) -> BaseInteractionEnv"


class Observation(TypedDict, total=False):
    obs_str: str
    role: str
    multi_modal_data: dict[str, list[Any]]


class EnvFailure(Exception):
    """An environment call raised or timed out: `kind` is ENV_ERROR or ENV_TIMEOUT."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class BaseInteractionEnv(abc.ABC):
    """One episode's environment (module doc). Subclass it and implement `reset` and `step`."""

    @abc.abstractmethod
    def reset(self) -> tuple[Observation, dict[str, Any]]:
        """Start the episode: (observation, info). Sample data comes through `build_env`."""

    @abc.abstractmethod
    def step(self, response_text: str) -> tuple[Observation | None, bool, dict[str, Any]]:
        """React to one model turn (its decoded text): (observation, done, info)."""

    def format_observation(self, observation: Observation) -> dict[str, Any]:
        """The observation as a chat message: media items as typed parts (at their `<image>`
        placeholders in `obs_str`, before the text for those without one), then the text."""
        return {"role": observation_role(observation), "content": observation_parts(observation)}

    def close(self) -> None:
        """Release what the episode holds (called once, however the episode ended)."""


def observation_role(observation: Observation) -> str:
    role = observation.get("role") or "user"
    return role if role in ROLES else "user"


def observation_parts(observation: Observation) -> list[dict[str, Any]]:
    """`obs_str` split at its media placeholders, each filled with the next item of its kind;
    items beyond the placeholders go first (the seeds' order: media, then text)."""
    text = observation.get("obs_str") or ""
    items = {kind: list(values) for kind, values in (observation.get("multi_modal_data") or {}).items()}
    unknown = sorted(set(items) - set(MULTIMODAL_PLACEHOLDERS))
    if unknown:
        raise ValueError(f"multi_modal_data has unknown kinds {unknown}; known: {sorted(MULTIMODAL_PLACEHOLDERS)}")
    parts: list[dict[str, Any]] = []
    for kind, values in items.items():
        extra = len(values) - text.count(MULTIMODAL_PLACEHOLDERS[kind])
        parts += [{"type": kind, kind: values.pop(0)} for _ in range(max(extra, 0))]
    by_placeholder = {p: k for k, p in MULTIMODAL_PLACEHOLDERS.items()}
    for piece in _split_placeholders(text):
        kind = by_placeholder.get(piece)
        if kind is not None and items.get(kind):
            parts.append({"type": kind, kind: items[kind].pop(0)})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _split_placeholders(text: str) -> list[str]:
    return re.split("(" + "|".join(re.escape(p) for p in MULTIMODAL_PLACEHOLDERS.values()) + ")", text)


def as_observation(value: Any) -> Observation:
    """A step's or reset's observation, checked: a dict as the module doc says, a string, or None."""
    if value is None:
        return {"obs_str": "", "role": "user"}
    if isinstance(value, str):
        return {"obs_str": value, "role": "user"}
    if not isinstance(value, dict) or not isinstance(value.get("obs_str", ""), str):
        raise ValueError(f"an observation is a dict {{'obs_str': str, 'role': ..., 'multi_modal_data': ...}} or a "
                         f"string, got {type(value).__name__}: {str(value)[:200]}")
    return value  # type: ignore[return-value]


@functools.lru_cache(maxsize=32)
def load_env_factory(path: str) -> Callable[..., Any]:
    """`path`'s `build_env` (or the factory `path` names), checked to take `sample=` and `args=`."""
    return load_factory(path, attr="build_env", flag="--rollout-interaction-env-path", keywords=("sample", "args"),
                        expected=BUILD_ENV_SIGNATURE)


async def build_env(path: str, sample: Any, args: Any, *, evaluation: bool, timeout: float) -> Any:
    """A fresh environment for `sample` (`evaluation=` is passed when the factory takes it)."""
    factory = load_env_factory(path)
    extra = {"evaluation": evaluation} if accepts_keyword(factory, "evaluation") else {}
    return await call_env(factory, timeout=timeout, what="build_env", sample=sample, args=args, **extra)


async def call_env(fn: Callable[..., Any], *args: Any, timeout: float, what: str, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, a coroutine on the loop or a function in a worker thread, within
    `timeout` seconds; an `EnvFailure` naming `what` when it raises or times out."""
    try:
        if inspect.iscoroutinefunction(fn):
            return await asyncio.wait_for(fn(*args, **kwargs), timeout)
        result = await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), timeout)
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(result, timeout)
        return result
    except asyncio.TimeoutError:
        raise EnvFailure(ENV_TIMEOUT, f"{what} did not return within --env-timeout {timeout} s") from None
    except Exception as exc:  # noqa: BLE001 - any environment fault ends its sample, never the run
        raise EnvFailure(ENV_ERROR, f"{what} raised {type(exc).__name__}: {exc}") from exc


def as_step(result: Any) -> tuple[Observation, bool, dict[str, Any]]:
    """`step`'s return value checked: (observation, done, info)."""
    if not isinstance(result, tuple) or len(result) != 3:
        raise EnvFailure(ENV_ERROR, f"step must return (observation, done, info), got {str(result)[:200]}")
    obs, done, info = result
    try:
        return as_observation(obs), bool(done), dict(info or {})
    except (TypeError, ValueError) as exc:
        raise EnvFailure(ENV_ERROR, f"step returned a bad value: {exc}") from exc
