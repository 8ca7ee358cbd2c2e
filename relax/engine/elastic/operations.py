"""Scaling operations: what one is (id, kind, request, status, events) and the book that admits them.

An operation is asynchronous: `OperationBook.submit` records it and returns at once; its task runs
the work and appends events. Operations are mutually exclusive: while one runs, another is refused
with `Conflict` naming the running one (HTTP 409). They are idempotent: a request carrying an
idempotency key that was seen before returns the operation that key started (whatever its state)
instead of starting another; the same key with a different request is refused (a client bug).
Finished operations are kept (the newest `KEEP`) so their status stays readable.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

KEEP = 256  # finished operations kept readable
FINAL = ("succeeded", "partial", "failed", "cancelled")


class ScalingError(Exception):
    """A refused scaling request: the HTTP status and a message naming the input and the fix."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra

    def body(self) -> dict[str, Any]:
        return {"error": self.message, **self.extra}


class Conflict(ScalingError):
    """Another operation runs (409, with its id)."""

    def __init__(self, message: str, running: str | None = None) -> None:
        super().__init__(409, message, **({"running_operation": running} if running else {}))


@dataclass
class Operation:
    id: str
    kind: str  # scale_out / register / scale_in
    request: dict[str, Any]
    key: str | None = None  # idempotency key
    status: str = "pending"  # pending, running, then one of FINAL
    phase: str = "queued"  # what it does now (launching, syncing weights, draining, releasing, ...)
    cancellable: bool = True  # False once engines are being released (no way back)
    created: float = field(default_factory=time.time)
    finished: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # engine addresses that joined
    removed: list[str] = field(default_factory=list)  # engine addresses that left
    requests_resent: int = 0  # requests of drained engines sent to others
    error: str | None = None
    requests_drained: int = 0  # requests that finished on draining engines
    task: asyncio.Task | None = None
    sink: Callable[[dict[str, Any]], None] | None = None  # where every event also goes (the run's event log)

    def event(self, message: str, **details: Any) -> None:
        record = {"time": time.time(), "message": message, **details}
        self.events.append(record)
        if self.sink is not None:
            self.sink({"operation": self.id, "kind": self.kind, **record})

    @property
    def done(self) -> bool:
        return self.status in FINAL

    @property
    def duration_s(self) -> float:
        return (self.finished or time.time()) - self.created

    def view(self) -> dict[str, Any]:
        """What GET /operations/{id} returns."""
        return {"id": self.id, "kind": self.kind, "status": self.status, "phase": self.phase,
                "request": self.request, "idempotency_key": self.key, "cancellable": self.cancellable and not self.done,
                "created": self.created, "finished": self.finished, "duration_s": round(self.duration_s, 3),
                "engines_added": self.added, "engines_removed": self.removed, "requests_resent": self.requests_resent,
                "requests_drained": self.requests_drained, "error": self.error, "events": self.events}


class OperationBook:
    """Every operation of the run; at most one running (module doc)."""

    def __init__(self, on_finish: Callable[[Operation], None] | None = None,
                 sink: Callable[[dict[str, Any]], None] | None = None, lock: asyncio.Lock | None = None) -> None:
        """`lock`: held while an operation works (the health manager's engine replacements hold it too)."""
        self.sink, self.lock = sink, lock or asyncio.Lock()
        self.operations: dict[str, Operation] = {}
        self.by_key: dict[str, str] = {}
        self.running: Operation | None = None
        self._ids = itertools.count(1)
        self._on_finish = on_finish

    def get(self, op_id: str) -> Operation:
        op = self.operations.get(op_id)
        if op is None:
            raise ScalingError(404, f"no operation {op_id!r} (ids are listed by GET /fleet under 'operations')")
        return op

    def submit(self, kind: str, request: dict[str, Any], key: str | None,
               work: Callable[[Operation], Awaitable[None]]) -> tuple[Operation, bool]:
        """(the operation, whether it is new): a known key returns its operation; else a new one runs
        `work(op)` in a task, unless another runs (`Conflict`)."""
        if key is not None and key in self.by_key:
            op = self.operations[self.by_key[key]]
            if (op.kind, op.request) != (kind, request):
                raise ScalingError(422, f"idempotency key {key!r} was used for another request ({op.kind} "
                                   f"{op.request}, operation {op.id}); use a new key for a new request")
            return op, False
        self.check_free(key)
        op = Operation(id=f"op-{next(self._ids)}", kind=kind, request=request, key=key, sink=self.sink)
        self.operations[op.id] = op
        if key is not None:
            self.by_key[key] = op.id
        self.running = op
        op.task = asyncio.ensure_future(self._run(op, work))
        self._prune()
        return op, True

    def check_free(self, key: str | None = None) -> None:
        """`Conflict` while an operation runs (unless `key` names a known one: the caller gets it back)."""
        if self.running is not None and (key is None or key not in self.by_key):
            raise Conflict(f"operation {self.running.id} ({self.running.kind}) is running; wait for it (GET "
                           f"/operations/{self.running.id}) or cancel it", self.running.id)

    async def _run(self, op: Operation, work: Callable[[Operation], Awaitable[None]]) -> None:
        try:
            if self.lock.locked():
                op.phase = "waiting for the fleet (an engine is being replaced)"
            async with self.lock:
                op.status = "running"
                await work(op)
        except asyncio.CancelledError:
            op.status = "cancelled"
        except Exception as exc:  # noqa: BLE001 - the operation fails, the run goes on; its record says why
            op.status, op.error = "failed", f"{type(exc).__name__}: {exc}"
            op.event(f"failed: {op.error}")
        else:
            if op.status == "running":
                op.status = "succeeded"
        finally:
            op.finished = time.time()
            if self.running is op:
                self.running = None
            if self._on_finish is not None:
                self._on_finish(op)

    def _prune(self) -> None:
        finished = [op for op in self.operations.values() if op.done]
        for op in finished[:max(0, len(finished) - KEEP)]:
            del self.operations[op.id]
            if op.key is not None:
                self.by_key.pop(op.key, None)

    def recent(self, n: int = 20) -> list[dict[str, Any]]:
        """The newest `n` operations, briefly (GET /fleet)."""
        return [{"id": op.id, "kind": op.kind, "status": op.status, "phase": op.phase}
                for op in list(self.operations.values())[-n:]]
