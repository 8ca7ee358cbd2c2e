"""`FleetScaler`: the scaling operations, carried out over a `FleetOps` (docs/elastic-scaling.md).

Scale-out (ray_native: `num_engines` / `target_engines`; external: `addresses`):
    launch (or register) the engines side by side, each healthy within --scale-out-timeout
    -> the partial-success policy decides what is kept (`policies.PARTIAL_SUCCESS`; nothing kept:
       every new engine is stopped or released and the operation fails)
    -> the kept engines get the weights the others have (`FleetOps.sync`, within the timeout)
    -> only then they join the router (`admit`).
Scale-in (`num_engines` / `target_engines` / `engines`):
    the chosen engines (`policies.pick_victims`: never a protected one, never the last) are drained:
    no new request, and no weight push waits on them -> their requests finish within
    --scale-in-drain-timeout, or are evicted and re-sent to the other engines -> they are released
    (ours stopped within --scale-in-shutdown-timeout, then killed; external ones left running).
Cancel: a scale-out's new engines are stopped or released, a scale-in's drained engines are routed to
again; the fleet is as before. A scale-in that began releasing engines can no longer be cancelled.
Every step is an event of the operation (`Operation.event`), and counted in `stats`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from relax.engine.elastic.operations import Operation, OperationBook, ScalingError
from relax.engine.elastic.policies import PARTIAL_SUCCESS, pick_victims, scale_in_count, scale_out_count
from relax.utils.poll import Backoff

logger = logging.getLogger(__name__)


class FleetOps(Protocol):
    """What the operations need of a fleet (an `EngineFleet` in this process: `local_ops`; in a run, the
    Rollout's fleet with weights from the Actor across Serve: `run_ops`)."""

    async def engines(self) -> list[dict[str, Any]]: ...  # EngineFleet.table()
    async def capacity(self) -> int | None: ...  # more engines the cluster has room for (None: unknown)
    async def launch(self, count: int, timeout: float, tag: str) -> list[dict[str, str]]: ...
    async def register(self, address: str, timeout: float, tag: str) -> dict[str, str]: ...
    async def sync(self, urls: list[str]) -> int | None: ...  # current weights to `urls`; their version
    async def admit(self, url: str) -> None: ...
    async def abandon(self, tag: str) -> list[str]: ...
    async def drain(self, url: str) -> None: ...
    async def undrain(self, url: str) -> None: ...
    async def in_flight(self, url: str) -> int: ...
    async def evict(self, url: str) -> int: ...
    async def release(self, url: str, timeout: float) -> None: ...


@dataclass(frozen=True)
class ScalerSettings:
    """The seed flags (`relax.config.elastic.ElasticConfig`)."""

    scale_out_timeout: float = 300.0
    partial_success_policy: str = "rollback_all"
    drain_timeout: float = 30.0
    shutdown_timeout: float = 30.0

    @classmethod
    def from_config(cls, e: Any) -> ScalerSettings:
        return cls(scale_out_timeout=e.scale_out_timeout, partial_success_policy=e.scale_out_partial_success_policy,
                   drain_timeout=e.scale_in_drain_timeout, shutdown_timeout=e.scale_in_shutdown_timeout)


class FleetScaler:
    def __init__(self, ops: FleetOps, settings: ScalerSettings,
                 sink: Callable[[dict[str, Any]], None] | None = None, lock: asyncio.Lock | None = None) -> None:
        """`lock`: the fleet's, shared with whatever else changes it (the health manager)."""
        self.ops, self.settings = ops, settings
        self.book = OperationBook(on_finish=self._finished, sink=sink, lock=lock)
        self.stats: Counter[str] = Counter()  # cumulative: operations by status, engines, requests, seconds
        self.finished: list[Operation] = []  # finished since the last `take_finished`

    # ---- requests (validated bodies: relax.engine.elastic.requests) ---------------------------
    async def status(self) -> dict[str, Any]:
        running = self.book.running
        return {"engines": await self.ops.engines(), "running_operation": running.id if running else None,
                "operations": self.book.recent()}

    async def scale_out(self, request: dict[str, Any], key: str | None = None) -> tuple[Operation, bool]:
        """Start a scale-out (module doc); (the operation, whether it is new)."""
        if "addresses" in request:
            addresses = list(request["addresses"])
            if key is None or key not in self.book.by_key:
                self.book.check_free()
                known = {e["address"] for e in await self.ops.engines()} & set(addresses)
                if known:
                    raise ScalingError(409, f"addresses: {sorted(known)} already serve in the fleet (GET /fleet)",
                                       field="addresses")
            return self._submit("register", request, key, lambda op: self._grow(op, self._register(op, addresses)))
        count = await self._count_out(request, key)
        return self._submit("scale_out", request, key, lambda op: self._grow(op, self._launch(op, count)))

    async def scale_in(self, request: dict[str, Any], key: str | None = None) -> tuple[Operation, bool]:
        """Start a scale-in (module doc); (the operation, whether it is new)."""
        if key is not None and key in self.book.by_key:
            return self._submit("scale_in", request, key, self._noop)
        self.book.check_free()
        engines = await self.ops.engines()
        victims = pick_victims(engines, scale_in_count(request, engines) if "engines" not in request else 0,
                               request.get("engines"))
        return self._submit("scale_in", request, key, lambda op: self._shrink(op, [v["address"] for v in victims]))

    def cancel(self, op_id: str) -> Operation:
        op = self.book.get(op_id)
        if op.done:
            raise ScalingError(409, f"operation {op_id} already ended ({op.status}): nothing to cancel")
        if not op.cancellable:
            raise ScalingError(409, f"operation {op_id} is {op.phase}: engines are leaving and cannot be taken back")
        assert op.task is not None
        op.event("cancel requested")
        op.task.cancel()
        return op

    def _submit(self, kind: str, request: dict[str, Any], key: str | None,
                work: Callable[[Operation], Awaitable[None]]) -> tuple[Operation, bool]:
        return self.book.submit(kind, request, key, work)

    async def _noop(self, op: Operation) -> None:
        """(never runs: a known idempotency key returns its operation)"""

    async def _count_out(self, request: dict[str, Any], key: str | None) -> int:
        if key is not None and key in self.book.by_key:
            return 0
        self.book.check_free()
        count = scale_out_count(request, await self.ops.engines())
        room = await self.ops.capacity()
        if room is not None and count > room:
            raise ScalingError(400, f"scale_out of {count} engine(s): the cluster has room for {room} more (free "
                               "GPUs on the Rollout replica's node over the GPUs an engine takes; on a CPU host, "
                               "engine threads per core); ask for fewer, free resources, or register running "
                               "engines with 'addresses'", field="num_engines")
        return count

    # ---- scale-out -----------------------------------------------------------------------------
    async def _launch(self, op: Operation, count: int) -> list[dict[str, str]]:
        op.phase = "launching"
        op.event(f"launching {count} engine(s), each healthy within {self.settings.scale_out_timeout:g}s")
        return await self.ops.launch(count, self.settings.scale_out_timeout, op.id) if count else []

    async def _register(self, op: Operation, addresses: list[str]) -> list[dict[str, str]]:
        op.phase = "registering"
        op.event(f"registering external engine(s) {addresses}")
        timeout = self.settings.scale_out_timeout
        return list(await asyncio.gather(*(self.ops.register(a, timeout, op.id) for a in addresses)))

    async def _grow(self, op: Operation, started: Awaitable[list[dict[str, str]]]) -> None:
        try:
            results = await started
            up, failed = [r["url"] for r in results if "url" in r], [r["error"] for r in results if "error" in r]
            for error in failed:
                op.event(f"an engine did not come up: {error}")
            keep = PARTIAL_SUCCESS[self.settings.partial_success_policy](up, failed)
            if not results:
                op.event("the fleet already has the engines asked for: nothing to do")
                return
            if not keep:
                raise RuntimeError(f"{len(failed)} of {len(results)} engine(s) did not come up; "
                                   f"--scale-out-partial-success-policy {self.settings.partial_success_policy} "
                                   "keeps none: the fleet is as before")
            op.phase = "syncing weights"
            version = await asyncio.wait_for(self.ops.sync(keep), self.settings.scale_out_timeout)
            op.event(f"engine(s) {keep} hold weight version {version}", weight_version=version)
            op.phase = "joining the router"
            for url in keep:
                await self.ops.admit(url)
                op.added.append(url)
            op.event(f"engine(s) {keep} joined the router")
            if failed:
                op.status = "partial"
        except BaseException as exc:
            await asyncio.shield(self._undo_growth(op, exc))
            raise

    async def _undo_growth(self, op: Operation, exc: BaseException) -> None:
        op.phase = "rolling back"
        gone = await self.ops.abandon(op.id)
        op.added.clear()
        why = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
        op.event(f"{why}: rolled back, new engine(s) {gone} stopped or released; the fleet is as before")

    # ---- scale-in ------------------------------------------------------------------------------
    async def _shrink(self, op: Operation, urls: list[str]) -> None:
        s = self.settings
        try:
            op.phase = "draining"
            for url in urls:
                await self.ops.drain(url)
            start = {url: await self.ops.in_flight(url) for url in urls}
            op.event(f"draining {urls}: no new requests, no weight pushes; {sum(start.values())} request(s) "
                     f"running there get {s.drain_timeout:g}s to finish")
            left = await self._wait_drained(urls, time.monotonic() + s.drain_timeout)
            if left:
                op.phase = "evicting"
                resent = sum([await self.ops.evict(url) for url in left])
                op.requests_resent += resent
                op.event(f"drain timeout: {resent} request(s) still running on {left} aborted and re-sent to "
                         "the other engines")
                await self._wait_drained(left, time.monotonic() + 10.0)
            op.requests_drained = max(0, sum(start.values()) - op.requests_resent)
        except BaseException:
            await asyncio.shield(self._undo_drain(op, urls))
            raise
        op.phase, op.cancellable = "releasing", False
        for url in urls:
            await self.ops.release(url, s.shutdown_timeout)
            op.removed.append(url)
        op.event(f"released {urls} (launched ones stopped within {s.shutdown_timeout:g}s or killed; external ones "
                 "left running)")

    async def _wait_drained(self, urls: list[str], deadline: float) -> list[str]:
        """Poll until no request runs on `urls` or `deadline`; the URLs still running some."""
        backoff = Backoff(max_s=0.2)
        while True:
            left = [u for u in urls if await self.ops.in_flight(u) > 0]
            if not left or time.monotonic() >= deadline:
                return left
            await backoff.wait()

    async def _undo_drain(self, op: Operation, urls: list[str]) -> None:
        op.phase = "rolling back"
        for url in urls:
            await self.ops.undrain(url)
        op.event(f"cancelled: {urls} take requests again; the fleet is as before")

    # ---- bookkeeping -------------------------------------------------------------------------
    def _finished(self, op: Operation) -> None:
        self.stats[f"operations_{op.status}"] += 1
        self.stats["engines_added"] += len(op.added)
        self.stats["engines_removed"] += len(op.removed)
        self.stats["requests_resent"] += op.requests_resent
        self.stats["requests_drained"] += op.requests_drained
        self.stats["operation_seconds"] += op.duration_s
        self.finished.append(op)
        logger.info("scaling: %s %s %s in %.1fs (+%d -%d engines)%s", op.id, op.kind, op.status, op.duration_s,
                    len(op.added), len(op.removed), f": {op.error}" if op.error else "")

    def take_finished(self) -> list[Operation]:
        """The operations finished since the last call (the step's metrics)."""
        done, self.finished = self.finished, []
        return done
