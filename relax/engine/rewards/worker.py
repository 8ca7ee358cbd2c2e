"""Worker processes for sync, CPU-heavy reward code (math-verify, sync custom rewards).

Why processes: math-verify is not thread-safe, uses SIGALRM for its own timeouts (main thread
only) and can hang on adversarial input; a hung thread cannot be stopped, a process can.
One `WorkerPool` with the async `run(task, timeout)`, over two kinds of worker:
  - `process_pool`: `multiprocessing` spawn workers driven over pipes from the event loop;
    used when Ray is not initialised.
  - `ray_pool`: small Ray actors (`num_cpus=0.1` each); used inside a Ray job.
A call that exceeds `timeout` kills its worker and starts a replacement; worker start-up
(imports) does not count against the timeout. A task is a picklable tuple run by `execute`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import multiprocessing
import pickle
import signal
import sys
from typing import Any, Callable, Protocol

from relax.utils import startup_gc
from relax.utils.plugins import import_object

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0


class RewardWorkerError(RuntimeError):
    """The reward code raised inside a worker (the worker itself is fine)."""


class WorkerDied(RuntimeError):
    """A worker process/actor exited or failed to start."""


# ----------------------------------------------------------------------------- task side


def preload(paths: list[str]) -> None:
    """Import modules (`pkg.mod`) and plugin paths (`pkg.mod.attr`) before the first task."""
    for path in paths:
        if path in sys.modules:
            continue
        try:
            importlib.import_module(path)
        except ModuleNotFoundError:
            import_object(path, flag="reward worker preload")
    startup_gc.started()  # the worker's start-up ends with its imports (relax/utils/startup_gc.py)


def run_task(task: tuple) -> Any:
    """Run one task. ("builtin", rm_type, response, label, metadata) -> the result;
    ("custom", path, args, sample_or_samples, kwargs) -> (result, metadata of each sample)."""
    kind = task[0]
    if kind == "builtin":
        from relax.engine.rewards.registry import full_grade

        _, rm_type, response, label, metadata = task
        return full_grade(rm_type, response, label, metadata)
    if kind == "custom":
        _, path, args, payload, kwargs = task
        result = import_object(path, flag="--custom-rm-path")(args, payload, **kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        samples = payload if isinstance(payload, list) else [payload]
        return result, [sample.metadata for sample in samples]
    raise ValueError(f"unknown reward task kind {kind!r}")


async def _await(awaitable: Any) -> Any:
    return await awaitable


def execute(task: tuple) -> tuple[str, Any]:
    """("ok", result) or ("error", "Type: message"): exceptions never cross the boundary."""
    try:
        return "ok", run_task(task)
    except Exception as exc:  # fault boundary: the parent logs and counts it
        return "error", f"{type(exc).__name__}: {exc}"


def _process_main(conn: Any, preload_paths: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        preload(preload_paths)
    except Exception as exc:  # report start-up failures instead of dying silently
        conn.send(("error", f"worker start-up failed: {type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        reply = execute(task)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("error", f"reward result cannot be sent back: {type(exc).__name__}: {exc}"))


# ----------------------------------------------------------------------------- workers


class _Worker(Protocol):
    async def wait_ready(self, timeout: float) -> None: ...

    async def call(self, task: tuple) -> Any: ...

    def kill(self) -> None: ...

    def stop(self) -> None: ...


def _unwrap(reply: tuple[str, Any]) -> Any:
    kind, payload = reply
    if kind == "error":
        raise RewardWorkerError(payload)
    return payload


class _ProcessWorker:
    """One spawned process, spoken to over a pipe whose fd the event loop watches."""

    def __init__(self, ctx: Any, preload_paths: list[str]):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_process_main, args=(child, preload_paths), daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    async def _receive(self) -> tuple[str, Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def on_readable() -> None:
            if future.done():
                return
            try:
                future.set_result(self.conn.recv())
            except (EOFError, OSError) as exc:
                future.set_exception(WorkerDied(f"reward worker pid {self.process.pid} exited ({exc!r})"))

        fd = self.conn.fileno()
        loop.add_reader(fd, on_readable)
        try:
            return await future
        finally:
            loop.remove_reader(fd)

    async def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        kind, payload = await asyncio.wait_for(self._receive(), timeout)
        if kind != "ready":
            raise WorkerDied(payload)
        self.ready = True

    async def call(self, task: tuple) -> Any:
        try:
            self.conn.send(task)  # pickles first, so a pickling error sends nothing
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise RewardWorkerError(f"reward task cannot be sent to a worker: {type(exc).__name__}: {exc}") from exc
        return _unwrap(await self._receive())

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass  # already gone
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


class RewardActor:
    """The Ray actor body: the same `execute` as the process workers."""

    def __init__(self, preload_paths: list[str], driver_sys_path: list[str]):
        # Plugins are named by dotted path relative to the driver's sys.path (e.g. the repo root).
        sys.path.extend(entry for entry in driver_sys_path if entry not in sys.path)
        preload(preload_paths)

    def ready(self) -> bool:
        return True

    def execute(self, task: tuple) -> tuple[str, Any]:
        return execute(task)


class _RayWorker:
    def __init__(self, actor_cls: Any, preload_paths: list[str]):
        self.actor = actor_cls.remote(preload_paths, list(sys.path))
        self.ready = False

    async def wait_ready(self, timeout: float) -> None:
        import ray

        if self.ready:
            return
        try:
            await asyncio.wait_for(self.actor.ready.remote(), timeout)
        except ray.exceptions.RayError as exc:
            raise WorkerDied(f"reward actor failed to start: {exc}") from exc
        self.ready = True

    async def call(self, task: tuple) -> Any:
        import ray

        try:
            reply = await self.actor.execute.remote(task)
        except ray.exceptions.RayActorError as exc:
            raise WorkerDied(f"reward actor died: {exc}") from exc
        return _unwrap(reply)

    def kill(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)

    stop = kill


# ----------------------------------------------------------------------------- pools


class WorkerPool:
    """`size` workers, one task each at a time; a timed-out or dead worker is replaced.

    Workers start lazily on first use. Invariant: free semaphore permits == workers in `_idle`,
    so `pop()` never fails. The semaphore is re-created when used from a new event loop.
    """

    def __init__(self, size: int, new_worker: Callable[[], _Worker], startup_timeout: float = STARTUP_TIMEOUT_S):
        if size < 1:
            raise ValueError(f"reward worker pool size must be >= 1 (--reward-num-workers), got {size}")
        self.size, self.startup_timeout, self._new_worker = size, startup_timeout, new_worker
        self._idle: list[_Worker] = []
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self.replaced = 0

    def _slots_for_this_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._slots = loop, asyncio.Semaphore(self.size)
        if not self._started:
            self._idle = [self._new_worker() for _ in range(self.size)]
            self._started = True
        return self._slots

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.replaced += 1
        self._idle.append(self._new_worker())

    async def run(self, task: tuple, timeout: float) -> Any:
        """The task's result. Raises TimeoutError (worker replaced), RewardWorkerError (the
        reward raised) or WorkerDied (worker crashed or could not start; replaced)."""
        async with self._slots_for_this_loop():
            worker = self._idle.pop()
            try:
                await worker.wait_ready(self.startup_timeout)
                result = await asyncio.wait_for(worker.call(task), timeout)
            except RewardWorkerError:
                self._idle.append(worker)
                raise
            except BaseException:  # timeout, death, cancellation: the worker's state is unknown
                self._replace(worker)
                raise
            self._idle.append(worker)
            return result

    def close(self) -> None:
        for worker in self._idle:
            worker.stop()
        self._idle.clear()
        self._started = False


def process_pool(size: int, preload_paths: list[str]) -> WorkerPool:
    """Spawned `multiprocessing` workers (spawn: safe next to threads, Ray and asyncio)."""
    ctx = multiprocessing.get_context("spawn")
    return WorkerPool(size, lambda: _ProcessWorker(ctx, list(preload_paths)))


def ray_pool(size: int, preload_paths: list[str], num_cpus: float = 0.1) -> WorkerPool:
    """Small Ray actors; used when the executor runs inside a Ray job."""
    import ray

    actor_cls = ray.remote(num_cpus=num_cpus, max_restarts=0)(RewardActor)
    return WorkerPool(size, lambda: _RayWorker(actor_cls, list(preload_paths)))
