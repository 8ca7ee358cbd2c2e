"""The `hf` engine's request scheduler: queue -> one continuously batched decode thread.

Requests are queued on the event loop. When the engine is idle, one scheduler task waits until
a burst of arrivals settles (the queue stops growing for 2 ms, at most `batch_wait_s`), then
takes everything queued (up to `max_running_requests`) as a batch and runs `BatchDecoder.run`
in a single worker thread, so the event loop stays free for health checks, aborts and weight
updates while the model runs. While that batch decodes, the decoder calls `admit` at every step
boundary: requests queued meanwhile are taken (up to `max_running_requests` running in total)
and JOIN the running batch (continuous batching), so no request waits for a whole batch to
finish. Each request's future is resolved the moment its row finishes.

The queue and the running list are shared by the event loop and the decode thread, so both
are guarded by one `threading.Lock` (held for a few list operations only); futures are only
ever resolved on the event loop (`call_soon_threadsafe`).

Pause follows SGLang's `/pause_generation` modes: `abort` (default) aborts queued and running
requests (finish_reason `abort`) and waits for the decode thread to go idle; `in_place` and
`retract` stop decoding at the next step boundary and keep the requests (this engine does not
free their KV cache, so both behave like `in_place`). While paused, new requests queue and
start after `/continue_generation`.

`step_hook(step)` (the profiler's, profiler.py) runs on the decode thread before each step (True)
and after each batch (False); `on_decode_thread(fn)` runs `fn` there, at once when idle.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from relax.backends.hf.decoder import BatchDecoder
from relax.backends.hf.rows import DecodeRow, RowResult

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")


@dataclass(eq=False)  # identity: list membership/removal must not compare fields
class _Pending:
    rid: str
    row: DecodeRow
    future: asyncio.Future


def _aborted_result(message: str) -> RowResult:
    return RowResult(output_ids=[], output_logprobs=[], finish_reason={"type": "abort", "message": message}, text="")


class Scheduler:
    """Batches concurrent requests onto a `BatchDecoder` running in one worker thread."""

    def __init__(self, decoder: BatchDecoder, *, max_running_requests: int = 256, batch_wait_s: float = 0.02,
                 quiet_s: float = 0.002, version: Callable[[], str] | None = None):
        """`version`: the weights' version now (the engine's); each result is stamped with it as its row
        ends (`RowResult.weight_version`)."""
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self.decoder, self.version = decoder, version
        self.max_running_requests = max_running_requests
        self.batch_wait_s, self.quiet_s = batch_wait_s, quiet_s
        self.paused_mode: str | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._running: list[_Pending] = []
        self._lock = threading.Lock()  # guards _queue and _running (event loop + decode thread)
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._unpaused = threading.Event()  # read by the decode thread
        self._unpaused.set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-decode")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self.step_hook: Callable[[bool], None] | None = None  # decode thread: before each step, after a batch

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="hf-scheduler")

    async def stop(self) -> None:
        self.abort(abort_all=True, message="engine shutting down")
        self._unpaused.set()
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- requests --------------------------------------------------------------------
    async def generate(self, rid: str, row: DecodeRow) -> RowResult:
        """Queue one row and wait for its result (an abort resolves it with finish_reason abort)."""
        future = asyncio.get_running_loop().create_future()
        pending = _Pending(rid, row, future)
        with self._lock:
            self._queue.append(pending)
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:  # the HTTP client went away: stop decoding for it
            row.abort_event.set()
            with self._lock:
                if pending in self._queue:
                    self._queue.remove(pending)
            raise

    def abort(self, rid: str | None = None, *, abort_all: bool = False, message: str = "request aborted") -> int:
        """Abort queued and running requests by rid (or all). Returns how many were found."""
        with self._lock:
            queued = [p for p in self._queue if abort_all or p.rid == rid]
            for pending in queued:
                self._queue.remove(pending)
            running = [p for p in self._running if abort_all or p.rid == rid]
        for pending in queued:
            if not pending.future.done():
                pending.future.set_result(self._stamped(_aborted_result(message)))
        found = len(queued)
        for pending in running:
            if not pending.future.done():
                pending.row.abort_message = message
                pending.row.abort_event.set()
                found += 1
        return found

    async def pause(self, mode: str = "abort") -> None:
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        self.paused_mode = mode
        self._unpaused.clear()
        if mode == "abort":
            self.abort(abort_all=True, message="aborted by pause_generation")
            await self._idle.wait()

    def _stamped(self, result: RowResult) -> RowResult:
        if self.version is not None:
            result.weight_version = self.version()
        return result

    def resume(self) -> None:
        self.paused_mode = None
        self._unpaused.set()
        self._wakeup.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def on_decode_thread(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the decode thread: at once when idle, after the running batch otherwise."""
        asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def info(self) -> dict:
        stats = self.decoder.stats
        return {
            "queued_requests": len(self._queue), "running_requests": len(self._running),
            "paused": self.paused_mode is not None, "pause_mode": self.paused_mode,
            "max_running_requests": self.max_running_requests, "num_batches": stats.batches,
            "num_joins": stats.joins, "num_joined_requests": stats.joined_requests,
            "num_forward_calls": stats.forward_calls, "generated_tokens": stats.generated_tokens,
            "prefill_rows_shared": stats.prefill_rows_shared,
            "busy_seconds": stats.busy_seconds,
            "recent_batch_sizes": list(stats.recent_batch_sizes),
        }

    # ---- the loop --------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            if not self._queue or self.paused_mode is not None:
                self._wakeup.clear()
                continue
            await self._coalesce()
            with self._lock:
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_running_requests))]
                self._running = list(batch)
            admitted = list(batch)  # every request this run decodes, in the decoder's row order
            self._idle.clear()
            try:
                await self._loop.run_in_executor(self._executor, self._decode_batch, admitted)
            except Exception as exc:  # a failed batch fails its requests; the engine keeps serving
                logger.exception("decode batch of %d failed", len(admitted))
                for pending in admitted:
                    if not pending.future.done():
                        pending.future.set_exception(RuntimeError(f"decode failed: {exc}"))
            finally:
                with self._lock:
                    self._running = []
                self._idle.set()

    async def _coalesce(self) -> None:
        """Let a burst of requests gather: wait until the queue stops growing for `quiet_s`
        (at most `batch_wait_s`), so concurrent requests share a batch instead of the first one
        starting alone while the rest wait for it to finish."""
        deadline = self._loop.time() + self.batch_wait_s
        seen = -1
        while len(self._queue) != seen and len(self._queue) < self.max_running_requests:
            seen = len(self._queue)
            if self._loop.time() >= deadline:
                return
            await asyncio.sleep(self.quiet_s)

    def _decode_batch(self, admitted: list[_Pending]) -> None:
        """Runs in the decode thread; `admitted` grows as queued requests join the batch."""
        def on_finish(i: int, result: RowResult) -> None:
            self._stamped(result)  # (here: a push that aborted the row may take its version before the reply)
            with self._lock:
                if admitted[i] in self._running:
                    self._running.remove(admitted[i])
            self._loop.call_soon_threadsafe(_resolve, admitted[i].future, result)

        def admit(running: int) -> list[DecodeRow]:
            if self.paused_mode is not None or not self._queue:
                return []
            with self._lock:
                room = min(len(self._queue), self.max_running_requests - running)
                taken = [self._queue.popleft() for _ in range(max(0, room))]
                self._running.extend(taken)
            admitted.extend(taken)
            return [p.row for p in taken]

        def before_step() -> None:  # in-place pause: hold here until continue or abort
            if self.step_hook is not None:
                self.step_hook(True)
            while not self._unpaused.is_set():
                with self._lock:
                    running = list(self._running)
                if all(p.row.abort_event.is_set() for p in running):
                    return
                self._unpaused.wait(0.05)

        self.decoder.run([p.row for p in admitted], on_finish=on_finish, before_step=before_step, admit=admit)
        if self.step_hook is not None:
            self.step_hook(False)


def _resolve(future: asyncio.Future, result: RowResult) -> None:
    if not future.done():
        future.set_result(result)
