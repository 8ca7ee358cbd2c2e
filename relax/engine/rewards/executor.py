"""`RewardExecutor`: sets `sample.reward` for a batch of samples, and never hangs or dies doing it.

Dispatch, in order: a `--custom-rm-path` plugin wins (per sample, or per call with
`--group-rm`); else the built-in type `sample.metadata["rm_type"]` or `--rm-type`.

Where code runs (measured, see docs/rewards.md): a built-in's string-only fast path runs inline
(microseconds); what it cannot decide (math-verify) and sync custom rewards run in worker
processes (Ray actors inside a Ray job, else spawned processes); async rewards (`remote_rm`,
`genrm`, async plugins) run in the event loop. Every call is bounded by `--reward-timeout`; a reward
that times out (its worker is killed and replaced) or raises gets `--reward-failure-value`,
is logged with the sample index and the error, and is counted in `stats()`.
Concurrency across all calls is capped by `--reward-max-concurrency`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import sys
import threading
import time
from collections import Counter
from typing import Any, Awaitable, Callable

from relax.engine.rewards.registry import fast_grade, full_grade, resolve
from relax.engine.rewards.worker import WorkerPool, process_pool, ray_pool
from relax.engine.specs import RewardSpec
from relax.types import Sample
from relax.utils.plugins import load_plugin

logger = logging.getLogger(__name__)

SINGLE_SIGNATURE = "reward_func(args, sample: Sample, **kwargs) -> float | dict (sync or async)"
GROUP_SIGNATURE = "reward_func(args, samples: list[Sample], **kwargs) -> list[float | dict] (sync or async)"
_FAILED = object()


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


class RewardExecutor:
    """Scores samples with built-in reward types or a custom reward plugin, as `spec` says.

    `plugin_args` is what a custom reward plugin is called with (the seed's `reward_func(args,
    sample, **kwargs)`); the executor itself reads only `spec`."""

    def __init__(self, spec: RewardSpec, plugin_args: Any = None):
        self.spec, self.args = spec, plugin_args
        self.rm_type, self.reward_key, self.group_rm = spec.rm_type, spec.reward_key, spec.group_rm
        self.rm_url = spec.rm_url
        self.judge = spec.judge  # the GenRM judge for rm_type genrm (None: no GenRM deployed)
        self.timeout, self.num_workers = float(spec.timeout), int(spec.num_workers)
        self.max_concurrency, self.failure_value = int(spec.max_concurrency), float(spec.failure_value)
        self._check_limits()
        self.custom_path: str | None = spec.custom_rm_path
        self.custom_fn = self._load_custom() if self.custom_path else None
        self._custom_async = self.custom_fn is not None and _is_async(self.custom_fn)
        self._custom_in_pool = self.custom_fn is not None and not self._custom_async and _picklable(plugin_args)
        if self.custom_fn is not None and not self._custom_async and not self._custom_in_pool:
            logger.warning("args cannot be pickled, so the sync --custom-rm-path runs in daemon threads: a hung "
                           "reward is abandoned after --reward-timeout but its thread cannot be stopped")
        if self.custom_fn is None and self.rm_type:
            resolve(self.rm_type)  # unknown --rm-type fails here, not per sample
        self._pool: WorkerPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit: asyncio.Semaphore | None = None
        self._counters: Counter[str] = Counter()

    def _check_limits(self) -> None:
        for flag, value in (("--reward-timeout", self.timeout), ("--reward-num-workers", self.num_workers),
                            ("--reward-max-concurrency", self.max_concurrency)):
            if value <= 0:
                raise ValueError(f"{flag} must be > 0, got {value}")

    def _load_custom(self) -> Callable[..., Any]:
        expected = GROUP_SIGNATURE if self.group_rm else SINGLE_SIGNATURE
        return load_plugin(self.custom_path, flag="--custom-rm-path", positional=2, expected=expected)

    # ------------------------------------------------------------------ public API

    async def score(self, samples: list[Sample], **kwargs: Any) -> None:
        """Set `sample.reward` on every sample; `kwargs` are passed on to a custom reward."""
        start = time.perf_counter()
        if self.custom_fn is not None and self.group_rm:
            await self._score_group(samples, kwargs)
        else:
            await asyncio.gather(*(self._score_one(i, sample, kwargs) for i, sample in enumerate(samples)))
        self._counters["reward/samples"] += len(samples)
        self._counters["reward/seconds"] += time.perf_counter() - start

    def reward_value(self, sample: Sample) -> float:
        """The scalar reward, taking `--reward-key` from dict rewards."""
        return sample.get_reward_value(self.reward_key)

    def stats(self, reset: bool = False) -> dict[str, float]:
        """Counters since start (or the last reset): failures, timeouts, seconds, samples,
        inline (decided by a fast path), pool (sent to a worker), workers_replaced."""
        keys = ("reward/failures", "reward/timeouts", "reward/seconds", "reward/samples", "reward/inline",
                "reward/pool")
        out = {key: float(self._counters[key]) for key in keys}
        live = self._pool.replaced if self._pool else 0
        out["reward/workers_replaced"] = float(self._counters["reward/workers_replaced"] + live)
        if reset:
            self._counters.clear()
            if self._pool:
                self._pool.replaced = 0
        return out

    def close(self) -> None:
        """Stop the worker pool (idempotent)."""
        if self._pool is not None:
            self._pool.close()
            self._counters["reward/workers_replaced"] += self._pool.replaced
            self._pool = None

    # ------------------------------------------------------------------ dispatch

    async def _score_one(self, position: int, sample: Sample, kwargs: dict) -> None:
        if self.custom_fn is not None:
            reward = await self._guarded([sample], position, lambda: self._custom_call(sample, kwargs))
        else:
            reward = await self._guarded([sample], position, lambda: self._builtin(sample))
        sample.reward = self.failure_value if reward is _FAILED else reward

    async def _score_group(self, samples: list[Sample], kwargs: dict) -> None:
        rewards = await self._guarded(samples, 0, lambda: self._custom_call(samples, kwargs))
        if rewards is not _FAILED:
            if not isinstance(rewards, (list, tuple)) or len(rewards) != len(samples):
                self._fail(samples, 0, f"--group-rm reward returned {type(rewards).__name__} "
                                       f"{_length(rewards)} for {len(samples)} samples; expected a list of that length")
                rewards = _FAILED
        for i, sample in enumerate(samples):
            sample.reward = self.failure_value if rewards is _FAILED else rewards[i]

    async def _builtin(self, sample: Sample) -> Any:
        rm_type = (sample.metadata or {}).get("rm_type") or self.rm_type
        if not rm_type:
            raise ValueError("no reward type: set --rm-type, metadata['rm_type'] on the row, or --custom-rm-path")
        metadata = sample.metadata or {}
        decided = fast_grade(rm_type, sample.response, sample.label, metadata)
        if decided is not None:
            self._counters["reward/inline"] += 1
            return decided
        if resolve(rm_type).is_async:
            coro = full_grade(rm_type, sample.response, sample.label, metadata, prompt=sample.prompt,
                              url=self.rm_url, judge=self.judge, timeout=self.timeout, proxy=self.spec.http_proxy)
            return await asyncio.wait_for(coro, self.timeout)
        self._counters["reward/pool"] += 1
        task = ("builtin", rm_type, sample.response, sample.label, metadata)
        return await self._get_pool().run(task, self.timeout)

    async def _custom_call(self, payload: Sample | list[Sample], kwargs: dict) -> Any:
        if self._custom_async:
            return await asyncio.wait_for(self.custom_fn(self.args, payload, **kwargs), self.timeout)
        if not self._custom_in_pool:
            return await asyncio.wait_for(_in_daemon_thread(self.custom_fn, self.args, payload, **kwargs),
                                          self.timeout)
        self._counters["reward/pool"] += 1
        task = ("custom", self.custom_path, self.args, payload, kwargs)
        result, metadatas = await self._get_pool().run(task, self.timeout)
        for sample, metadata in zip(payload if isinstance(payload, list) else [payload], metadatas):
            sample.metadata = {**(sample.metadata or {}), **metadata}  # the plugin ran on a copy
        return result

    # ------------------------------------------------------------------ fault tolerance

    async def _guarded(self, samples: list[Sample], position: int, call: Callable[[], Awaitable[Any]]) -> Any:
        """The call's result, or `_FAILED` (logged and counted) when it times out or raises."""
        async with self._concurrency_limit():
            try:
                return await call()
            except TimeoutError:
                self._counters["reward/timeouts"] += len(samples)
                self._fail(samples, position, f"timed out after {self.timeout:g}s (--reward-timeout)")
            except Exception as exc:  # fault boundary: a bad reward must not stop the run
                self._fail(samples, position, f"{type(exc).__name__}: {exc}")
        return _FAILED

    def _fail(self, samples: list[Sample], position: int, error: str) -> None:
        self._counters["reward/failures"] += len(samples)
        indices = [s.index if s.index is not None else position + i for i, s in enumerate(samples)]
        logger.warning("reward failed for sample index %s (reward = %g): %s", indices if len(indices) > 1
                       else indices[0], self.failure_value, error)

    def _concurrency_limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._limit = loop, asyncio.Semaphore(self.max_concurrency)
        return self._limit

    def _get_pool(self) -> WorkerPool:
        if self._pool is None:
            # Import in the worker before its first task, so start-up never eats the timeout.
            preload = [self.custom_path] if self._custom_in_pool else ["relax.engine.rewards.registry", "math_verify"]
            ray = sys.modules.get("ray")
            if ray is not None and ray.is_initialized():
                self._pool = ray_pool(self.num_workers, preload)
            else:
                self._pool = process_pool(self.num_workers, preload)
        return self._pool


def _in_daemon_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future:
    """Run `fn` in its own daemon thread: unlike the loop's default executor, a hung call then
    blocks neither `asyncio.run`'s shutdown nor interpreter exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            result, error = fn(*args, **kwargs), None
        except Exception as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop has closed: nobody is waiting for this (abandoned) call any more

    threading.Thread(target=target, name="relax-reward", daemon=True).start()
    return future


def _length(value: Any) -> str:
    return f"of length {len(value)}" if hasattr(value, "__len__") else ""
