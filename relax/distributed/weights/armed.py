"""Relax's armed weight push (`weight_push_armed`): a push's whole layout in one request, then its
buckets back to back on the group with no request per bucket.

Why: on 2x H200 a push's wire time was a fraction of its cost (4B shape at 512 MiB buckets: 0.078 s
against 0.022 s for a raw NCCL broadcast of the same bytes); the rest was HTTP control calls (pause
and session, one `/update_weights_from_distributed` per bucket, end and resume: ~32 ms a push plus
~5 ms a bucket) and the engine's dispatch of each bucket. An armed receiver is told everything at once:

1. `/arm_weight_update` {group_name, layout_id, buckets: [{names, dtypes, shapes, bytes}, ...],
   load_format, weight_version, flush_cache, pause_mode}: the receiver pauses generation (`pause_mode`,
   as `/pause_generation`), opens its weight-update session, and arms a loop in a thread of its own
   (`ArmedPush`) that takes the buckets from the group in that order and loads each one as
   `/update_weights_from_distributed` would (`WeightReceiver.receive_and_load`: checked, in place
   where the layout allows, flat buffers laid out by `protocol.flat_layout`, whose length each
   bucket's `bytes` states so both sides agree before a byte moves). The version is taken once the
   last bucket is in. `layout_id` names the layout (`layout_digest` of the buckets' (name, dtype,
   shape) rows; buckets whose digest differs are refused, 400): the receiver keeps the last
   `LAYOUTS_KEPT` layouts parsed by id (`Layouts`), and a sender that had one accepted arms that
   receiver with the id and no `buckets` from then on (`ArmLayouts`; a trainer pushes the same layout
   every step, and 310 tensors' lists cost ~1.4 ms to build and ~2 ms to receive and validate). A
   receiver that does not hold the id (restarted, or it kept newer ones) answers 409 (`LayoutUnknown`)
   having paused nothing, and is armed once more with the buckets. The first push of a layout holds
   bucket 0 until every arm is accepted (`sender._ahead`), so those refusals come before a byte is
   broadcast.
   Ahead (`weight_push_ahead`): where every receiver holds the layout, the arm goes by id with `ahead:
   true` and `bytes` (each bucket's flat length), and the buckets are broadcast at once, not after its
   reply (one HTTP round trip off the push's critical path; docs/gpu.md has the figures). A receiver
   that refuses such an arm still takes the bytes (`ArmedDrain`: it receives `bytes` and drops them) and
   says so: 409 (the sender pushes again, the layout sent) or a 400 `success: false` (raised; the group
   is in step). Any other answer means it takes nothing: the sender breaks the group (on NCCL, aborting
   it at close ends the broadcasts it left queued).
2. The sender broadcasts the buckets back to back, and posts at once
3. `/end_weight_update` {continue_generation: true}: answered when the loop is done: the session
   is closed, generation resumed, and the reply is the loop's. `success: false` (HTTP 400): a bucket
   was refused after its bytes were received (a name or shape the model lacks; nothing more is loaded
   after it, the later buckets are received and dropped), the group is in step. HTTP 500: a receive
   or load failed mid-bucket (the group is out of step: quarantined here, rebuilt by the sender); the
   reply comes as soon as the loop stops, so the sender, which waits on it while it broadcasts, does
   not hang in a broadcast nobody takes.

Two requests a push, whatever the bucket count. A receiver announces the extension (the hf engine's
/server_info `weight_push_armed`); SGLang never does and gets the plain protocol. The training ranks
behind Ray do not arm: a loop loading in its own thread would overlap the log-prob forwards the actor
runs meanwhile, which Ray's one call at a time keeps apart from per-bucket loads today.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sequence

import torch

from relax.distributed.weights.protocol import (
    FLAT_BYTES, BucketRejected, LayoutUnknown, TensorSpec, WeightSyncError, dtype_name, flat_layout, parse_specs,
    spec_bytes, tensor_bytes,
)
from relax.distributed.weights.trace import mark

logger = logging.getLogger(__name__)

ARM_PATH = "/arm_weight_update"
END_PATH = "/end_weight_update"
MAX_TENSORS_PER_PUSH = 1_000_000  # an arm request listing more is refused
LAYOUTS_KEPT = 4  # layouts a receiver holds by id (`Layouts`): a trainer pushes one layout, or a few
SENDER_LAYOUTS_KEPT = 8  # layouts a sender keeps built (`ArmLayouts`)


@dataclass(frozen=True)
class ArmedPlan:
    """A push as `/arm_weight_update` describes it: its buckets in broadcast order."""

    group_name: str
    buckets: list[list[TensorSpec]]
    flat: bool  # each bucket one broadcast of its bytes (`load_format: flat_bytes`), else one per tensor
    weight_version: str | None
    flush_cache: bool
    layout_id: str | None = None  # the layout's `layout_digest`, where the sender named it


@dataclass(frozen=True)
class ArmedOutcome:
    """How an armed push ended on this receiver. `received`: every bucket's bytes were taken off the
    wire (the group is in step); `success`: and every one was loaded and the version taken."""

    success: bool
    received: bool
    message: str


class ArmedReceiver(Protocol):
    """What the loop needs of `receiver.WeightReceiver`."""

    groups: dict[str, Any]

    def receive_and_load(self, specs: list[TensorSpec], group_name: str, *, flat: bool = False,
                         deferred: bool = False) -> tuple[bool, str]: ...
    def receive_flat(self, specs: list[TensorSpec], group: Any, *, wait: bool = True) -> list[torch.Tensor]: ...
    def receive(self, specs: list[TensorSpec], group: Any) -> list[torch.Tensor]: ...
    def take_version(self, success: bool, message: str, weight_version: Any) -> tuple[bool, str]: ...
    def begin(self) -> None: ...
    def open_session(self) -> None: ...


def layout_digest(buckets: Iterable[Iterable[tuple[str, str, Sequence[int]]]]) -> str:
    """A push layout's `layout_id`: sha256 of its buckets' (name, dtype name, shape) rows, in broadcast
    order, as compact JSON. The sender computes it from its tensors, the receiver from the buckets sent
    with it; the flat lengths (`bytes`) follow from the rows and are not part of it."""
    rows = [[[name, dtype, list(shape)] for name, dtype, shape in bucket] for bucket in buckets]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def spec_rows(buckets: Sequence[Sequence[TensorSpec]]) -> list[list[tuple[str, str, tuple[int, ...]]]]:
    """Parsed buckets as `layout_digest` reads them (dtype aliases named as the sender names them)."""
    return [[(s.name, dtype_name(s.dtype), s.shape) for s in bucket] for bucket in buckets]


@dataclass(frozen=True)
class ArmLayout:
    """Sender side: one push layout as `/arm_weight_update` sends it (per bucket its names, dtypes, shapes
    and flat length) and its `layout_digest`."""

    layout_id: str
    buckets: list[dict[str, Any]]


def arm_layout(buckets: Sequence[Sequence[tuple[str, torch.Tensor]]]) -> ArmLayout:
    """The layout of `buckets` (HF-named tensors, in broadcast order)."""
    layout = []
    for bucket in buckets:
        layout.append({"names": [n for n, _ in bucket], "dtypes": [dtype_name(t.dtype) for _, t in bucket],
                       "shapes": [list(t.shape) for _, t in bucket],
                       "bytes": flat_layout([tensor_bytes(t) for _, t in bucket])[1]})
    rows = ([*zip(b["names"], b["dtypes"], b["shapes"])] for b in layout)
    return ArmLayout(layout_digest(rows), layout)


def arm_payload(buckets: ArmLayout | Sequence[Sequence[tuple[str, torch.Tensor]]], *, group_name: str, flat: bool,
                weight_version: str, pause_mode: str) -> dict[str, Any]:
    """The sender's `/arm_weight_update` body for `buckets` (HF-named tensors in broadcast order, or their
    `ArmLayout`), buckets and `layout_id` (`ArmLayouts.arm` leaves the buckets out for a receiver holding it)."""
    layout = buckets if isinstance(buckets, ArmLayout) else arm_layout(buckets)
    return {"group_name": group_name, "layout_id": layout.layout_id, "buckets": layout.buckets,
            "load_format": FLAT_BYTES if flat else None, "weight_version": weight_version, "flush_cache": True,
            "pause_mode": pause_mode}


class Layouts:
    """Receiver side: the parsed buckets of the last `size` layouts armed with a `layout_id`, by id, so an
    arm naming one alone is neither sent nor parsed again (310 tensors of a 0.6B model: ~2 ms of
    JSON and validation a push)."""

    def __init__(self, size: int = LAYOUTS_KEPT) -> None:
        self.size = size
        self._kept: OrderedDict[str, list[list[TensorSpec]]] = OrderedDict()
        self._lengths: dict[str, list[int]] = {}  # a kept layout's flat bucket lengths (`flat_lengths`)

    def get(self, layout_id: str) -> list[list[TensorSpec]] | None:
        buckets = self._kept.get(layout_id)
        if buckets is not None:
            self._kept.move_to_end(layout_id)
        return buckets

    def put(self, layout_id: str, buckets: list[list[TensorSpec]]) -> None:
        self._kept[layout_id] = buckets
        self._kept.move_to_end(layout_id)
        while len(self._kept) > self.size:
            self._lengths.pop(self._kept.popitem(last=False)[0], None)

    def flat_lengths(self, layout_id: str, buckets: list[list[TensorSpec]]) -> list[int]:
        """The flat length of each of `buckets` (the layout `layout_id` names), worked out once per kept layout."""
        lengths = self._lengths.get(layout_id) if self._kept.get(layout_id) is buckets else None
        if lengths is None:
            lengths = [flat_layout([spec_bytes(s) for s in specs])[1] for specs in buckets]
            if self._kept.get(layout_id) is buckets:
                self._lengths[layout_id] = lengths
        return lengths

    def clear(self) -> None:
        self._kept.clear()
        self._lengths.clear()


class ArmLayouts:
    """Sender side: each distinct push layout's `ArmLayout`, built once (keyed by the push's (name, dtype,
    shape) rows and bucket boundaries; the last `size`), and the layout ids each receiver has accepted:
    a receiver is armed by id alone with a layout it accepted before (`arm`)."""

    def __init__(self, size: int = SENDER_LAYOUTS_KEPT) -> None:
        self.size = size
        self._layouts: OrderedDict[tuple, ArmLayout] = OrderedDict()
        self._accepted: dict[int, set[str]] = {}  # by id(receiver): the sender holds its receivers

    def layout(self, buckets: Sequence[Sequence[tuple[str, torch.Tensor]]]) -> ArmLayout:
        key = tuple(tuple((name, t.dtype, tuple(t.shape)) for name, t in bucket) for bucket in buckets)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = arm_layout(buckets)
            while len(self._layouts) > self.size:
                _, dropped = self._layouts.popitem(last=False)
                for ids in self._accepted.values():
                    ids.discard(dropped.layout_id)
        self._layouts.move_to_end(key)
        return layout

    def accepted(self, receiver: Any) -> set[str]:
        return self._accepted.setdefault(id(receiver), set())

    def held_by_all(self, receivers: Sequence[Any], layout_id: str) -> bool:
        """Every one of `receivers` accepted `layout_id` before (it may be armed ahead of its answer)."""
        return all(layout_id in self.accepted(r) for r in receivers)

    async def arm(self, receiver: Any, payload: dict[str, Any], remaining: Callable[[], float], *,
                  ahead: bool = False) -> Any:
        """`/arm_weight_update` on `receiver` with `payload` (an `arm_payload` with its buckets), by its
        layout_id alone where the receiver accepted that before. A receiver that no longer holds it
        (LayoutUnknown, HTTP 409: restarted, or the layout pushed out of its `Layouts`; it paused and
        armed nothing) is sent the buckets once more. `remaining`: seconds left to the push's deadline.
        `ahead` (the receiver holds the layout, `held_by_all`): the sender broadcasts without waiting for
        this answer, so the arm says so with every bucket's flat length (`ahead_payload`), and a
        LayoutUnknown is raised, not answered with the buckets: the receiver drains this push."""
        accepted, layout_id = self.accepted(receiver), payload["layout_id"]
        if ahead:
            try:
                return await receiver.post(ARM_PATH, ahead_payload(payload), remaining())
            except LayoutUnknown:
                accepted.discard(layout_id)
                raise
        if layout_id in accepted:
            try:
                return await receiver.post(ARM_PATH, {k: v for k, v in payload.items() if k != "buckets"},
                                           remaining())
            except LayoutUnknown as exc:
                accepted.discard(layout_id)
                logger.info("%s no longer holds layout %s (%s): arming it with the buckets", receiver,
                            layout_id[:12], exc)
        reply = await receiver.post(ARM_PATH, payload, remaining())
        accepted.add(layout_id)
        return reply


def ahead_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """An `arm_payload` as an arm ahead of the broadcasts sends it: by `layout_id` alone, with `ahead` and
    each bucket's flat length in `bytes` (what a refusing receiver drains)."""
    body = {k: v for k, v in payload.items() if k != "buckets"}
    return {**body, "ahead": True, "bytes": [b["bytes"] for b in payload["buckets"]]}


def _as_sync_error(exc: BaseException) -> WeightSyncError:
    return exc if isinstance(exc, WeightSyncError) else WeightSyncError(f"{END_PATH} failed: "
                                                                        f"{type(exc).__name__}: {exc}")


async def watched(waiting: Awaitable[None], ends: Sequence[asyncio.Future]) -> None:
    """Sender side: await `waiting` (a bucket landing), cut short by an armed receiver's end call that
    failed other than by a refusal (its loop stopped: the broadcasts would wait for it until the
    deadline). A refusing loop still takes every byte; its end is raised by `await_ends`."""
    if not ends:
        return await waiting
    main = asyncio.ensure_future(waiting)
    while True:
        if main.done():
            return main.result()
        stopped = [e.exception() for e in ends if e.done() and not e.cancelled() and e.exception() is not None
                   and not isinstance(e.exception(), BucketRejected)]
        if stopped:
            main.cancel()
            raise _as_sync_error(stopped[0])
        await asyncio.wait([main, *(e for e in ends if not e.done())], return_when=asyncio.FIRST_COMPLETED)


async def await_ends(receivers: Sequence[Any], ends: Sequence[asyncio.Future], deadline: float,
                     timeout_s: float) -> None:
    """Sender side: every armed receiver's end call answered by `deadline`; the first failure raised
    (a refusal, BucketRejected, leaves the group in step; the caller breaks it for anything else)."""
    if not ends:
        return
    await asyncio.wait(ends, timeout=max(deadline - time.monotonic(), 0))
    late = [str(r) for r, end in zip(receivers, ends) if not end.done()]
    errors = [end.exception() for end in ends if end.done() and end.exception() is not None]
    worse = [e for e in errors if not isinstance(e, BucketRejected)]
    if worse:
        raise _as_sync_error(worse[0])
    if late:
        raise WeightSyncError(f"the armed weight update on {', '.join(late)} did not finish within the "
                              f"{timeout_s:.0f}s deadline")
    if errors:
        raise errors[0]


def parse_plan(payload: dict[str, Any], layouts: Layouts | None = None) -> ArmedPlan:
    """Validate an `/arm_weight_update` body; ValueError naming the bucket and the fault, LayoutUnknown for
    a `layout_id` sent alone that `layouts` does not hold. A layout sent with its id is kept in `layouts`."""
    load_format = payload.get("load_format")
    if load_format not in (None, FLAT_BYTES):
        raise ValueError(f"load_format={load_format!r}: an armed push is sent tensor by tensor (null) "
                         f"or as one buffer per bucket ({FLAT_BYTES!r})")
    layout_id = payload.get("layout_id")
    return ArmedPlan(group_name=payload["group_name"], buckets=_plan_buckets(payload, layouts),
                     flat=load_format == FLAT_BYTES, weight_version=payload.get("weight_version"),
                     flush_cache=bool(payload.get("flush_cache", True)), layout_id=layout_id)


def _plan_buckets(payload: dict[str, Any], layouts: Layouts | None) -> list[list[TensorSpec]]:
    """The buckets sent (checked against their `layout_id` where one came with them), or those of the
    `layout_id` sent alone."""
    layout_id, buckets = payload.get("layout_id"), payload.get("buckets")
    if buckets is None and layout_id is not None:
        kept = layouts.get(layout_id) if layouts is not None else None
        if kept is None:
            raise LayoutUnknown(f"layout_id {layout_id!r} was sent without its buckets, and this receiver does not "
                                f"hold it (it keeps the last {LAYOUTS_KEPT} it was sent; a restarted engine none): "
                                "send the buckets with it")
        return kept
    plan = parse_buckets(buckets or [])
    if layout_id is not None:
        digest = layout_digest(spec_rows(plan))
        if digest != layout_id:
            raise ValueError(f"layout_id {layout_id!r} does not match the buckets sent with it (their layout_id is "
                             f"{digest!r}: armed.layout_digest): sender and receiver disagree on the layout")
        if layouts is not None:
            layouts.put(layout_id, plan)
    return plan


def ahead_problem(payload: dict[str, Any]) -> str | None:
    """Why an arm sent `ahead` of its buckets cannot be drained if refused (no `bytes`, not flat), or None."""
    if not payload.get("ahead"):
        return None
    if payload.get("load_format") != FLAT_BYTES:
        return f"ahead: true needs load_format {FLAT_BYTES!r} (a refused push is drained bucket by bucket)"
    sizes = payload.get("bytes")
    if not sizes or any(not isinstance(n, int) or n < 0 for n in sizes):
        return "ahead: true needs bytes, each bucket's flat length (what a refused push is drained by)"
    return None


def check_sizes(plan: ArmedPlan, sizes: Sequence[int], layouts: Layouts) -> None:
    """ValueError unless `sizes` (an arm ahead's `bytes`) are the flat lengths of `plan`'s buckets (kept with
    the layout in `layouts`: ~0.2 ms of Python on a 310-tensor push, on the arm's path, computed once)."""
    expected = layouts.flat_lengths(plan.layout_id or "", plan.buckets)
    if list(sizes) != expected:
        raise ValueError(f"bytes {list(sizes)[:8]} do not match the layout's buckets {expected[:8]} "
                         "(protocol.flat_layout): sender and receiver disagree on the layout")


def parse_buckets(buckets: list[dict[str, Any]]) -> list[list[TensorSpec]]:
    """An arm's `buckets` as specs, each bucket's `bytes` checked against its flat layout."""
    if not buckets:
        raise ValueError("buckets is empty: nothing to update")
    if sum(len(b.get("names") or ()) for b in buckets) > MAX_TENSORS_PER_PUSH:
        raise ValueError(f"at most {MAX_TENSORS_PER_PUSH} tensors per armed push")
    plan = []
    for i, bucket in enumerate(buckets):
        try:
            specs = parse_specs(bucket["names"], bucket["dtypes"], bucket["shapes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bucket {i}: {exc}") from exc
        expected = flat_layout([spec_bytes(s) for s in specs])[1]
        if bucket.get("bytes") is not None and bucket["bytes"] != expected:
            raise ValueError(f"bucket {i}: says {bucket['bytes']} bytes, its tensors lay out in {expected} "
                             "(protocol.flat_layout): sender and receiver disagree on the layout")
        plan.append(specs)
    return plan


class ArmedPush:
    """The receive loop of one armed push: a daemon thread takes `plan`'s buckets from `group`, in
    order, into `receiver`; `future` holds its `ArmedOutcome`. It ends when every bucket's bytes are
    in, or at the first receive or load that raised (the rest of the push is then not taken)."""

    def __init__(self, receiver: ArmedReceiver, plan: ArmedPlan, group: Any, *, start: bool = True) -> None:
        self.receiver, self.plan, self.group = receiver, plan, group
        self.future: concurrent.futures.Future[ArmedOutcome] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name=f"weight-sync-armed-{plan.group_name}", daemon=True)
        self._started = threading.Lock()
        if start:
            self.start()

    def start(self) -> None:
        """Start the loop (once; later calls do nothing). The hf engine starts it after the arm's reply
        is written: the loop's first bucket holds the GIL for a millisecond or two, which delayed that
        reply, and with it the sender's first broadcast, by as much (2x H200 trace)."""
        if self._started.acquire(blocking=False):
            self._thread.start()

    def done(self) -> bool:
        return self.future.done()

    def _run(self) -> None:
        try:
            outcome = self._take_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the end call, which names it
            outcome = ArmedOutcome(False, False, f"the armed weight update failed: {type(exc).__name__}: {exc}")
        if not outcome.success:
            logger.warning("armed weight update on group %s: %s", self.plan.group_name, outcome.message)
        self.future.set_result(outcome)

    def _take_all(self) -> ArmedOutcome:
        # The push begins here rather than in /arm_weight_update, whose reply the sender waits for: the model
        # walk (~1-2 ms on a 36-layer model) overlaps that reply and the sender's first pack.
        mark("engine: loop starts")
        self.receiver.begin()
        self.receiver.open_session()
        mark("engine: model walked")
        plan, count = self.plan, len(self.plan.buckets)
        refused: str | None = None
        for i, specs in enumerate(plan.buckets):
            last = i == count - 1
            if self.receiver.groups.get(plan.group_name) is not self.group:  # destroyed (or made anew) meanwhile
                return ArmedOutcome(False, False, f"bucket {i} of {count}: the group {plan.group_name!r} is gone")
            try:
                if refused is not None:  # the push failed: take the bytes, load nothing more
                    self._drop(specs)
                    continue
                ok, message = self.receiver.receive_and_load(specs, plan.group_name, flat=plan.flat, deferred=not last)
            except Exception as exc:  # noqa: BLE001 - the bytes may be half taken: the group is out of step
                return ArmedOutcome(False, False, f"bucket {i} of {count} failed: {type(exc).__name__}: {exc}")
            mark(f"engine: bucket {i} {'in' if last else 'queued'}")
            if not ok:
                refused = f"bucket {i} of {count}: {message}"
        if refused is not None:
            return ArmedOutcome(False, True, refused)
        success, message = self.receiver.take_version(True, f"loaded {count} buckets.", plan.weight_version)
        mark("engine: loop done")
        return ArmedOutcome(success, True, message)

    def _drop(self, specs: list[TensorSpec]) -> None:
        if self.plan.flat:
            self.receiver.receive_flat(specs, self.group)
        else:
            self.receiver.receive(specs, self.group)


class ArmedDrain:
    """Receiver side of a refused arm that came ahead of its buckets (`ahead`): a daemon thread takes each
    bucket's bytes (`sizes`, the flat lengths the arm stated) off `group` and drops them, so the sender's
    broadcasts end and the group stays in step. `future` holds the message of how it ended."""

    def __init__(self, group: Any, sizes: Sequence[int], group_name: str, why: str,
                 on_failure: Callable[[], None] = lambda: None) -> None:
        """`on_failure`: called when a receive fails (the group is out of step: its owner quarantines it)."""
        self.group, self.sizes, self.group_name, self.why = group, list(sizes), group_name, why
        self._on_failure = on_failure
        self.future: concurrent.futures.Future[str] = concurrent.futures.Future()
        threading.Thread(target=self._run, name=f"weight-sync-drain-{group_name}", daemon=True).start()

    def done(self) -> bool:
        return self.future.done()

    def _run(self) -> None:
        try:
            scratch = torch.empty(max(self.sizes, default=0), dtype=torch.uint8, device=self.group.device)
            for size in self.sizes:  # (one buffer: the receives are ordered on the group)
                self.group.broadcast(scratch[:size], src=0)
            self.group.synchronize()
            message = f"drained {len(self.sizes)} buckets of a refused push ({self.why})"
        except BaseException as exc:  # noqa: BLE001 - logged: the sender's broadcast fails on its own
            message = f"draining a refused push failed: {type(exc).__name__}: {exc}"
            logger.warning("group %s: %s", self.group_name, message)
            self._on_failure()
        self.future.set_result(message)

