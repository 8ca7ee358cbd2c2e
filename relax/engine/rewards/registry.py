"""The reward hub: every built-in reward type by name, and `grade()`, the one way to run one.

A built-in scorer is `score(response, label, metadata) -> float | dict` (sync), or async for
`remote_rm` and `genrm`, which also take keyword-only request context (`prompt`, `url`,
`judge`, `timeout`).
`FAST_PATHS` holds, per type, a cheap string-only function returning the result when it can
decide without math-verify and None when it cannot; for pure-string types it is the scorer
itself. The executor runs fast paths inline and sends only undecided rows to worker
processes; `grade()` runs the same two steps in the caller's process.

`boxed_<type>` applies `<type>` to the content of the response's last `\\boxed{}` (an empty
string when there is none), e.g. `boxed_f1`, `boxed_multiple_choice`.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from relax.engine.rewards import (
    dapo,
    deepscaler,
    f1,
    genrm,
    gpqa,
    ifbench,
    math_rm,
    multiple_choice,
    openr1mm,
    remote_rm,
)
from relax.engine.rewards.extract import last_boxed
from relax.utils.plugins import accepts_keyword

RewardResult = float | dict[str, Any]

REWARD_TYPES: dict[str, Callable[..., Any]] = {
    "math": math_rm.score,
    "deepscaler": deepscaler.score,
    "dapo": dapo.score,
    "gpqa": gpqa.score,
    "f1": f1.score,
    "multiple_choice": multiple_choice.score,
    "openr1mm": openr1mm.score,
    "ifbench": ifbench.score,
    "remote_rm": remote_rm.score,
    "genrm": genrm.score,
}

FAST_PATHS: dict[str, Callable[..., RewardResult | None]] = {
    "math": math_rm.fast_path,
    "deepscaler": deepscaler.fast_path,
    "openr1mm": openr1mm.fast_path,
    "dapo": dapo.score,
    "gpqa": gpqa.score,
    "f1": f1.score,
    "multiple_choice": multiple_choice.score,
    "ifbench": ifbench.score,
}

BOXED_PREFIX = "boxed_"


@dataclass(frozen=True)
class RewardType:
    """A resolved `--rm-type`: its scorer, its fast path (or None) and whether it is async."""

    name: str
    score: Callable[..., Any]
    fast_path: Callable[..., RewardResult | None] | None
    is_async: bool


def known_types() -> list[str]:
    return sorted(REWARD_TYPES) + [f"{BOXED_PREFIX}<type>"]


def _on_boxed(fn: Callable[..., Any], response: str, label: Any, metadata: dict | None = None) -> Any:
    return fn(last_boxed(response) or "", label, metadata)


def resolve(rm_type: str) -> RewardType:
    """The built-in reward named `rm_type`; ValueError listing the known types otherwise."""
    if rm_type in REWARD_TYPES:
        fn = REWARD_TYPES[rm_type]
        return RewardType(rm_type, fn, FAST_PATHS.get(rm_type), inspect.iscoroutinefunction(fn))
    if isinstance(rm_type, str) and rm_type.startswith(BOXED_PREFIX) and len(rm_type) > len(BOXED_PREFIX):
        inner = resolve(rm_type[len(BOXED_PREFIX):])
        if inner.is_async:
            raise ValueError(f"rm_type {rm_type!r}: the {BOXED_PREFIX} prefix applies to sync types only")
        fast = partial(_on_boxed, inner.fast_path) if inner.fast_path else None
        return RewardType(rm_type, partial(_on_boxed, inner.score), fast, False)
    raise ValueError(f"unknown rm_type {rm_type!r} (--rm-type or metadata['rm_type']); known types: {known_types()}")


def fast_grade(rm_type: str, response: str, label: Any, metadata: dict | None = None) -> RewardResult | None:
    """The result when the type's string-only fast path decides it, else None."""
    reward = resolve(rm_type)
    return None if reward.fast_path is None else reward.fast_path(response, label, metadata or {})


def full_grade(rm_type: str, response: str, label: Any, metadata: dict | None = None, **context: Any) -> Any:
    """Run the full scorer (sync result, or a coroutine for async types). Context keywords
    (`prompt`, `url`, `judge`, `timeout`) are passed only to scorers that take them."""
    reward = resolve(rm_type)
    kwargs = {key: value for key, value in context.items() if accepts_keyword(reward.score, key)}
    return reward.score(response, label, metadata or {}, **kwargs)


def grade(rm_type: str, response: str, label: Any, metadata: dict | None = None, *, prompt: Any = "",
          rm_url: str | None = None, judge: Any = None, timeout: float = 60.0) -> RewardResult:
    """Score one response with a built-in reward type, synchronously.

    The same two steps the reward executor runs: the fast path, then the full scorer (async
    scorers such as `remote_rm` run via `asyncio.run`, so call this outside an event loop).
    """
    decided = fast_grade(rm_type, response, label, metadata)
    if decided is not None:
        return decided
    result = full_grade(rm_type, response, label, metadata, prompt=prompt, url=rm_url, judge=judge, timeout=timeout)
    return asyncio.run(result) if inspect.isawaitable(result) else result
