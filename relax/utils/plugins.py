"""Dotted-path plugin loading with signature checks at startup.

Every plugin flag (`--custom-rm-path`, `--custom-generate-function-path`, ...) names a
callable as `package.module.attr`. `load_plugin` imports it and checks that it can be
called the way the framework will call it, so a wrong signature fails before Ray starts
with a message naming the flag and the expected signature, not deep inside a rollout.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable


class PluginError(ValueError):
    """A plugin path that cannot be imported or a callable with the wrong signature."""


def import_object(path: str, *, flag: str = "plugin path") -> Any:
    """Import `package.module.attr` (attr may be nested: `module.Class.method`)."""
    if not isinstance(path, str) or "." not in path:
        raise PluginError(f"{flag}: {path!r} is not a dotted path like 'my_pkg.my_module.my_function'")
    parts = path.split(".")
    error: Exception | None = None
    for split in range(len(parts) - 1, 0, -1):
        module_name, attrs = ".".join(parts[:split]), parts[split:]
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and not module_name.startswith(exc.name) and exc.name != module_name:
                raise PluginError(f"{flag}: importing {module_name!r} failed: {exc}") from exc
            error = exc
            continue
        try:
            for attr in attrs:
                obj = getattr(obj, attr)
        except AttributeError as exc:
            raise PluginError(f"{flag}: module {module_name!r} has no attribute {'.'.join(attrs)!r}") from exc
        return obj
    raise PluginError(
        f"{flag}: cannot import {path!r} ({error}); is its package on PYTHONPATH (run from the repo root)?"
    )


def check_signature(fn: Callable[..., Any], *, flag: str, positional: int, keywords: tuple[str, ...] = (),
                    expected: str) -> None:
    """Fail unless `fn` accepts `positional` positional args plus the given keyword args."""
    if not callable(fn):
        raise PluginError(f"{flag}: {fn!r} is not callable; expected {expected}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins / C callables: nothing to check
    try:
        sig.bind(*range(positional), **{k: None for k in keywords})
    except TypeError as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise PluginError(f"{flag}: {name}{sig} cannot be called as {expected} ({exc})") from exc


def load_plugin(path: str, *, flag: str, positional: int, keywords: tuple[str, ...] = (), expected: str,
                optional: tuple[str, ...] = ()) -> Any:
    """Import a plugin by dotted path and check it can be called as `expected` describes: with
    `positional` arguments, `keywords`, and those of the `optional` keywords it names (the caller
    passes exactly those: `accepts_keyword`)."""
    fn = import_object(path, flag=flag)
    named = tuple(k for k in optional if accepts_keyword(fn, k))
    check_signature(fn, flag=flag, positional=positional, keywords=keywords + named, expected=expected)
    return fn


def load_async_plugin(path: str, *, flag: str, positional: int, keywords: tuple[str, ...] = (), expected: str) -> Any:
    """`load_plugin` for a plugin Relax awaits: it must be an `async def` (a coroutine function)."""
    fn = load_plugin(path, flag=flag, positional=positional, keywords=keywords, expected=expected)
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))):
        raise PluginError(f"{flag}: {getattr(fn, '__qualname__', repr(fn))} is not an async function; expected "
                          f"{expected}")
    return fn


def load_factory(path: str, *, attr: str, flag: str, keywords: tuple[str, ...], expected: str) -> Any:
    """`path` names a module exposing `attr` (the seeds' `rollout_interaction_env_path: pkg.env_mod` ->
    `pkg.env_mod.build_env`) or the callable itself; imported and checked to take `keywords`."""
    try:
        obj = importlib.import_module(path)
    except ImportError:
        obj = None
    if obj is None:
        fn = import_object(path, flag=flag)
    elif not hasattr(obj, attr):
        raise PluginError(f"{flag}: module {path!r} has no {attr}(); expected {expected}")
    else:
        fn = getattr(obj, attr)
    check_signature(fn, flag=flag, positional=0, keywords=keywords, expected=expected)
    return fn


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """True when `fn` takes a parameter `name` (or **kwargs): used for optional plugin args."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a sync or async plugin and return its result."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result
