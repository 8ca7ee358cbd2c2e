"""Rank 0 of a weight push: `WeightSender` sends HF-named tensors to every receiver.

It drives the protocol of `protocol.py` (connect: the group; push: pause, session, buckets (the
last one flushes the engines' caches), end, resume; close) against receivers of any transport
(`endpoints.py`: engine URLs become `HTTPEndpoint`s; `RayEndpoint`s and other objects with the
same `post` are used as they are). A receiver on the sender's own GPU cannot join an NCCL group
with it: it gets each bucket as CUDA IPC handles through `/update_weights_from_tensor` instead (`ipc.py`), written by
`ipc.encode_bucket` / `ipc.tensor_payload` with the sender's `serializer`.

Failure handling: a broadcast has no timeout of its own on NCCL, so it runs in a worker thread
and the HTTP replies are the waiters (as TRL does): an engine that rejects a bucket raises
`WeightSyncError` with the engine's message at once; everything has the deadline `timeout_s`.
If a broadcast was left unfinished the group is marked broken and the next push asks for a
reconnect. After a failed push the engines are resumed (they keep serving the weights they
have, which may be partly new); the caller decides whether to retry.

Pipelined buckets: when every receiver loads buckets in order (the hf engine says so in
/server_info, training ranks behind Ray do), up to `pipeline_depth` buckets are in flight at once:
their requests (numbered by `bucket_index`) go out together, the broadcasts follow in order on one
chain of threads, and the next bucket is prepared while earlier ones travel. A push's fixed cost
is then a few round trips, not one per bucket. SGLang engines and CUDA IPC receivers (one staging
buffer per push) get one bucket at a time.

Armed receivers (the hf engine's /server_info `weight_push_armed`; `armed.py`) get no request per
bucket at all: `/arm_weight_update` tells them every bucket of the push (with the pause and the
session's opening; a layout the receiver was sent before by its id alone), their
`/end_weight_update` (with the resume) is posted as soon as they are armed and answers once their
receive loop has taken the last bucket, and meanwhile the buckets are broadcast back to back. Two
requests a push; the end call is the waiter, so a loop that stopped fails the push at once. From a
layout's second push on, where every receiver takes `weight_push_ahead`, the buckets leave before the
arms are answered (`_push_ahead`; a refusing receiver drains them, armed.py). A fleet
may mix them with the others: the broadcasts are the same, only the other receivers get their
requests per bucket (a failure before every bucket went out then breaks the group, since the armed
loops wait for buckets that will not come).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from relax.distributed.store import listen
from relax.distributed.weights.armed import END_PATH, ArmLayouts, arm_payload, await_ends, watched
from relax.distributed.weights.chain import BroadcastChain
from relax.distributed.weights.endpoints import (
    AHEAD, ARMED, EXTENSIONS, FLAT, IN_ORDER, Endpoint, HTTPEndpoint, receiver_features,
)
from relax.distributed.weights.group import (
    WeightGroup, create_weight_group, group_master_address, run_in_daemon_thread,
)
from relax.distributed.weights.ipc import encode_bucket, serialize, tensor_payload
from relax.distributed.weights.protocol import (
    DEFAULT_BUCKET_BYTES, FLAT_BYTES, BucketRejected, EndpointMissing, LayoutUnknown, SyncStats, WeightSyncError,
    dtype_name, iter_buckets, tensor_bytes, with_last,
)

logger = logging.getLogger(__name__)

DEFAULT_PIPELINE_DEPTH = 4  # buckets in flight at once, where every receiver takes them in order
FLAT_DEPTH = 3  # flat buckets in flight at once: each holds a copy of its bytes until it lands
CLOSE_TIMEOUT_S = 30.0  # closing a group: each receiver's answer and this rank's own shutdown


@dataclass
class _Flight:
    """One bucket on its way: the receivers' replies and the broadcast, and its bytes."""

    tasks: list[asyncio.Future]
    nbytes: int


class WeightSender:
    """Rank 0 of the weight group: pushes HF-named tensors to every engine (see module doc)."""

    def __init__(self, engine_urls: Sequence[str | Endpoint], *, api_key: str | None = None, backend: str = "gloo",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = 300.0,
                 master_address: str = "127.0.0.1", group_name: str | None = None, transport: Any = None,
                 device: torch.device | str | None = None, pause_mode: str = "abort",
                 ipc_ranks: Sequence[int] | None = None, serializer: Callable[[Any], Any] = serialize,
                 pipeline_depth: int = DEFAULT_PIPELINE_DEPTH, extensions: bool | Iterable[str] = True):
        """`engine_urls`: SGLang HTTP base URLs, or receiver objects with the same protocol as
        `async post(path, payload, timeout_s)` (training-backend ranks that take weights too).
        `pause_mode`: what `/pause_generation` does to in-flight requests while weights load
        ("abort" in colocate, where none are in flight; "in_place" keeps them running on the new
        weights; partial rollout aborts and resubmits them). `ipc_ranks`, per receiver: 0 for one
        on another GPU (it joins the broadcast group), else it shares this GPU and takes CUDA IPC
        handles through `/update_weights_from_tensor`, one copy per tensor-parallel rank, each
        written by `serializer` (`ipc.serialize`; tests pass one that keeps CPU tensors as they are).
        `extensions`: use Relax's extensions of the protocol where the receivers take them
        (pipelined and flat buckets, overlapped control calls, armed pushes; protocol.py); False speaks
        plain SGLang to every receiver (the benches' baseline); a collection of their names
        (`endpoints.EXTENSIONS`) uses those only (the benches compare them)."""
        if not engine_urls:
            raise ValueError("WeightSender needs at least one engine URL")
        self.receivers: list[Endpoint] = [HTTPEndpoint(u, api_key=api_key, transport=transport)
                                          if isinstance(u, str) else u for u in engine_urls]
        self._ipc = ipc = list(ipc_ranks) if ipc_ranks is not None else [0] * len(self.receivers)
        if len(ipc) != len(self.receivers):
            raise ValueError(f"ipc_ranks has {len(ipc)} entries for {len(self.receivers)} receivers")
        self.group_receivers = [r for r, n in zip(self.receivers, ipc) if not n]
        self.ipc_receivers = [(r, n) for r, n in zip(self.receivers, ipc) if n]
        self.serializer = serializer
        self._staging: torch.Tensor | None = None  # the flat-bucket buffer of a push to ipc_receivers (_staging_for)
        self.pause_mode = pause_mode
        self.backend, self.bucket_bytes, self.timeout_s = backend, bucket_bytes, timeout_s
        self.master_address, self.device = master_address, device
        self.group_name = group_name or f"relax-weights-{uuid.uuid4().hex[:8]}"
        self._group: WeightGroup | None = None
        self.pipeline_depth = max(1, pipeline_depth)
        self.extensions = frozenset(EXTENSIONS if extensions is True else () if extensions is False else extensions)
        if self.extensions - set(EXTENSIONS):
            raise ValueError(f"extensions: unknown {sorted(self.extensions - set(EXTENSIONS))}; "
                             f"choose from {list(EXTENSIONS)}")
        self.armed: list[Endpoint] = []  # group receivers told a whole push in one request (armed.py)
        self.plain, self.posted = self.receivers, self.group_receivers  # the others; those of them in the group
        self.depth = 1  # buckets in flight at once: `pipeline_depth` where every receiver takes them in order
        self.flat = False  # each bucket one broadcast of its bytes: where every group receiver takes them
        self.together = False  # pause with session open, end with resume: where every receiver is Relax's
        self.ahead = False  # buckets broadcast before the arms are answered: where every receiver takes that
        self._chain = BroadcastChain(lambda: self._broken)  # the broadcasts, in bucket order (chain.py)
        self._layouts = ArmLayouts()  # each push layout's arm payload, built once, and who holds which
        self._connected = False
        self._broken = False
        self._lock = asyncio.Lock()

    # ---- helpers ---------------------------------------------------------------------
    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WeightSyncError(f"weight sync exceeded its deadline of {self.timeout_s:.0f}s")
        return remaining

    async def _post_to(self, receivers: list[Endpoint], path: str, payload: dict, deadline: float) -> list[Any]:
        remaining = self._remaining(deadline)
        return await asyncio.gather(*(r.post(path, payload, remaining) for r in receivers))

    async def _wait_all(self, tasks: list[asyncio.Future], deadline: float, what: str) -> None:
        """Wait for every task; the first failure or the deadline raises WeightSyncError.

        A BucketRejected alone leaves the other tasks running (the caller settles them);
        any other failure or the deadline cancels them.
        """
        done, pending = await asyncio.wait(tasks, timeout=max(deadline - time.monotonic(), 0),
                                           return_when=asyncio.FIRST_EXCEPTION)
        errors = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
        if errors and all(isinstance(e, BucketRejected) for e in errors):
            raise errors[0]
        for task in pending:
            task.cancel()
        if errors:
            exc = next(e for e in errors if not isinstance(e, BucketRejected))
            if isinstance(exc, WeightSyncError):
                raise exc
            raise WeightSyncError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        if pending:
            raise WeightSyncError(f"{what} did not finish within the {self.timeout_s:.0f}s deadline")

    # ---- protocol --------------------------------------------------------------------
    async def connect(self) -> None:
        """Create the group: every engine joins as rank 1 + i while this process joins as rank 0."""
        if self._group is not None or self._connected:
            raise WeightSyncError("connect() called twice; call close() first")
        self._connected = True
        self._chain.reset()  # a new group: no broadcast of an earlier one to wait for
        announced = await asyncio.gather(*(receiver_features(r) for r in self.receivers)) if self.extensions \
            else [frozenset()] * len(self.receivers)
        features = [f & self.extensions for f in announced]
        self.together = all(IN_ORDER in f for f in features)
        self.flat = bool(self.group_receivers) and all(
            FLAT in f for f, n in zip(features, self._ipc) if not n)
        self.armed = [r for r, f, n in zip(self.receivers, features, self._ipc) if not n and ARMED in f]
        self.plain = [r for r in self.receivers if r not in self.armed]
        self.ahead = bool(self.armed) and not self.plain and self.flat and all(
            AHEAD in f for r, f in zip(self.receivers, features) if r in self.armed)
        self.posted = [r for r in self.group_receivers if r not in self.armed]
        self.depth = 1 if self.ipc_receivers or not self.together else (
            min(self.pipeline_depth, FLAT_DEPTH) if self.flat else self.pipeline_depth)
        if not self.group_receivers:  # every receiver shares this GPU: handles only, no group
            logger.info("weight push by CUDA IPC to %d receiver(s) on this GPU", len(self.ipc_receivers))
            return
        if self.backend == "nccl" and self.device is None:  # resolve here: the join runs in another thread
            self.device = torch.device("cuda", torch.cuda.current_device())
        deadline = time.monotonic() + self.timeout_s
        urls = [r.url for r in self.group_receivers if isinstance(r, HTTPEndpoint)]
        self.master_address = group_master_address(self.master_address, urls)
        listener = listen(self.master_address)  # held from here: no other process can take the port
        port = listener.getsockname()[1]
        world_size = 1 + len(self.group_receivers)
        http = [asyncio.ensure_future(r.post("/init_weights_update_group", {
            "master_address": self.master_address, "master_port": port, "rank_offset": 1 + i,
            "world_size": world_size, "group_name": self.group_name, "backend": self.backend,
        }, self.timeout_s)) for i, r in enumerate(self.group_receivers)]
        join = run_in_daemon_thread(
            create_weight_group, master_address=self.master_address, master_port=port, rank=0,
            world_size=world_size, group_name=self.group_name, backend=self.backend, timeout_s=self.timeout_s,
            device=self.device, listener=listener)
        try:
            await self._wait_all([*http, join], deadline, "init_weights_update_group")
        except BaseException:
            listener.close()
            raise
        self._group, self._broken = join.result(), False
        logger.info("weight group %s up: %d engine(s), backend %s, port %d%s", self.group_name,
                    len(self.group_receivers), self.backend, port,
                    f"; {len(self.ipc_receivers)} more on this GPU by CUDA IPC" if self.ipc_receivers else "")

    async def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> SyncStats:
        """Pause, send every bucket, resume. Raises WeightSyncError naming the engine on failure."""
        if not self._connected:
            raise WeightSyncError("push() before connect(): call `await sender.connect()` first")
        if self._broken:
            raise WeightSyncError("the weight group is broken by an earlier failed sync; "
                                  "call close() and connect() again")
        async with self._lock:
            start = time.monotonic()
            deadline = start + self.timeout_s
            buckets: Iterable[list[tuple[str, torch.Tensor]]] = iter_buckets(named_tensors, self.bucket_bytes)
            if self.armed:  # armed receivers are told every bucket before the first goes out
                buckets = list(buckets)
                if not buckets:
                    raise WeightSyncError("push() got no tensors")
            pause = asyncio.ensure_future(self._post_to(self.plain, "/pause_generation", {"mode": self.pause_mode},
                                                        deadline))  # (an armed receiver pauses as it arms)
            if not self.together:  # SGLang: paused before the session opens
                await pause
            resumed = False
            try:  # (no /flush_cache round trip: the last bucket flushes)
                total_bytes, num_buckets, sessions = await self._push_in_sessions(buckets, version, deadline, pause)
                resumed = True  # the weights are all in (armed receivers resumed as their sessions ended)
                if self.together:  # resume as the sessions end
                    await asyncio.gather(self._end_sessions(sessions, deadline, raising=True),
                                         self._resume_engines(self.plain))
                else:
                    await self._resume_engines(self.plain)
            finally:
                self._staging = None  # receivers let go of it at end_weight_update
                if self.ipc_receivers and torch.cuda.is_available():
                    torch.cuda.ipc_collect()
                if not resumed:
                    await asyncio.gather(pause, return_exceptions=True)  # (settled before the resume)
                    await self._resume_engines(self.receivers)
            if num_buckets == 0:
                raise WeightSyncError("push() got no tensors")
        seconds = time.monotonic() - start
        stats = SyncStats(bytes=total_bytes, seconds=seconds, gbps=total_bytes / max(seconds, 1e-9) / 1e9,
                          num_buckets=num_buckets, version=version)
        logger.info("weight sync v%d: %d bytes in %.3fs (%.3f GB/s, %d buckets) to %d engine(s)",
                    version, stats.bytes, stats.seconds, stats.gbps, num_buckets, len(self.receivers))
        return stats

    async def _push_in_sessions(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: int,
                                deadline: float, pause: asyncio.Future) -> tuple[int, int, list[Endpoint]]:
        """Every bucket inside a weight-update session on each engine that has sessions (armed
        receivers: armed with all of them), once the engines are paused, up to `depth` in flight at
        once; returns (bytes, buckets, the plain receivers with a session). The version rides on the
        last bucket. The plain sessions are left open where the caller ends them with the resume
        (`together`); the armed receivers' ends are awaited here."""
        if self.ahead and isinstance(buckets, list) and buckets and self._layouts.held_by_all(
                self.armed, self._layouts.layout(buckets).layout_id):
            return await self._push_ahead(buckets, version, deadline, pause)
        total_bytes = num_buckets = 0
        flights: deque[_Flight] = deque()
        ahead = self._ahead(buckets, str(version), deadline)  # (bucket 0, packed while the arms travel)
        try:
            sessions, ends = await self._open(buckets, str(version), deadline)
        except BaseException:
            if ahead is not None:  # bucket 0 must not go out (and armed receivers may wait for it)
                self._broken = True
            raise
        finally:
            if ahead is not None:  # its broadcast goes now, unless the arm failed (`_broken`)
                self._chain.open_gate()
        try:
            await pause
            for index, (bucket, is_last) in enumerate(with_last(iter(buckets))):
                if index == 0 and ahead is not None:
                    flights.append(ahead)
                    num_buckets += 1
                    continue
                if len(flights) >= self.depth:
                    total_bytes += await self._land(flights, deadline, ends)
                flights.append(self._launch(bucket, index, str(version) if is_last else None, deadline))
                num_buckets += 1
            while flights:
                total_bytes += await self._land(flights, deadline, ends)
            await await_ends(self.armed, ends, deadline, self.timeout_s)
        except BaseException as exc:
            self._abandon(flights, ends, exc)
            await self._end_sessions(sessions, deadline, raising=False)
            raise
        if not self.together:
            await self._end_sessions(sessions, deadline, raising=True)
        return total_bytes, num_buckets, sessions

    def _abandon(self, flights: deque[_Flight], ends: Sequence[asyncio.Future], exc: BaseException) -> None:
        """After a failed push: nothing more lands; the group is broken unless every armed loop answered a refusal."""
        for flight in flights:  # a failure broke the group (or was settled)
            for task in flight.tasks:
                task.cancel()
        if ends and not (isinstance(exc, BucketRejected) and all(end.done() for end in ends)):
            self._broken = True  # armed loops wait for buckets that will not come, or stopped mid-bucket
        for end in ends:
            end.cancel()

    async def _push_ahead(self, buckets: list[list[tuple[str, torch.Tensor]]], version: int, deadline: float,
                          pause: asyncio.Future) -> tuple[int, int, list[Endpoint]]:
        """Every receiver armed and holding this push's layout (`weight_push_ahead`): the buckets go out at once,
        their arms (`armed.ahead_payload`) travelling meanwhile, so the first byte waits for no round trip. A
        receiver that refuses drains every bucket: refused for its layout id (restarted), the push is made again
        the armed way, with the layout; refused otherwise, the refusal is raised (the group stays in step)."""
        flights: deque[_Flight] = deque()
        payload = arm_payload(self._layouts.layout(buckets), group_name=self.group_name, flat=True,
                              weight_version=str(version), pause_mode=self.pause_mode)
        remaining = functools.partial(self._remaining, deadline)
        arms = [asyncio.ensure_future(self._layouts.arm(r, payload, remaining, ahead=True)) for r in self.armed]
        # One turn of the loop: each arm's first step writes its request on a pooled connection before the
        # buckets' threads take the GIL to pack (launched first, they held the arms back by 2 ms on 2x H200).
        await asyncio.sleep(0)
        watch: list[asyncio.Future] = []  # the arms, then the accepted receivers' end calls
        watch.append(asyncio.ensure_future(self._arm_ahead(arms, deadline, watch)))
        total_bytes = 0
        try:
            for index, (bucket, is_last) in enumerate(with_last(iter(buckets))):
                if len(flights) >= self.depth:
                    total_bytes += await self._land(flights, deadline, watch)
                flights.append(self._launch(bucket, index, str(version) if is_last else None, deadline))
            while flights:
                total_bytes += await self._land(flights, deadline, watch)
            refused = await watch[0]
            await await_ends([r for r in self.armed if r not in refused], watch[1:], deadline, self.timeout_s)
        except BaseException as exc:
            self._abandon(flights, watch, exc)
            raise
        if any(isinstance(e, LayoutUnknown) for e in refused.values()):  # (drained): once more, with the layout
            logger.info("%s did not hold the push's layout (its buckets were drained): pushing again with it",
                        ", ".join(str(r) for r, e in refused.items() if isinstance(e, LayoutUnknown)))
            return await self._push_in_sessions(buckets, version, deadline, pause)
        if refused:
            raise next(iter(refused.values()))
        return total_bytes, len(buckets), []

    async def _arm_ahead(self, arms: list[asyncio.Future], deadline: float,
                         ends: list[asyncio.Future]) -> dict[Endpoint, WeightSyncError]:
        """The arms sent ahead of the buckets (`arms`, one per armed receiver) answered: post the end call of each
        that accepted (appended to `ends`); returns the refusals, whose receivers drain the push. Raises
        anything worse: a receiver that takes nothing leaves the broadcasts waiting, and the group is rebuilt."""
        results = await asyncio.gather(*arms, return_exceptions=True)
        drains = (LayoutUnknown, BucketRejected)  # refusals whose receiver drains the push
        refused = {r: e for r, e in zip(self.armed, results) if isinstance(e, drains)}
        worse = [e for e in results if isinstance(e, BaseException) and not isinstance(e, drains)]
        if worse:
            raise worse[0] if isinstance(worse[0], WeightSyncError) else WeightSyncError(
                f"arm_weight_update failed: {worse[0]!r}")
        ends.extend(asyncio.ensure_future(r.post(END_PATH, {"continue_generation": True}, self._remaining(deadline)))
                    for r in self.armed if r not in refused)
        return refused

    def _ahead(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: str,
               deadline: float) -> _Flight | None:
        """Where every receiver is armed (none needs a request per bucket), bucket 0 is launched before the
        arms are answered: it is packed meanwhile, and its broadcast waits for the chain's gate (`_open` sets it;
        after a failed arm the group is `_broken` and the broadcast is skipped). None otherwise."""
        if not self.armed or self.plain or not isinstance(buckets, list) or not buckets:
            return None
        self._chain.gate()
        return self._launch(buckets[0], 0, version if len(buckets) == 1 else None, deadline)

    async def _open(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: str,
                    deadline: float) -> tuple[list[Endpoint], list[asyncio.Future]]:
        """`/begin_weight_update` on the plain receivers and `/arm_weight_update` (the whole push's
        layout, or its id alone where a receiver holds it: `armed.ArmLayouts`) on the armed ones, at once;
        then the armed ones' `/end_weight_update`, posted now and answered when their loops are done.
        Returns the plain receivers with a session open, and those end calls. A failed arm breaks the
        group (another receiver's loop may be armed on it); bucket 0 waits for this to return (`_ahead`)."""
        if not self.armed:
            return await self._begin_sessions(self.plain, deadline), []
        payload = arm_payload(self._layouts.layout(buckets), group_name=self.group_name, flat=self.flat,
                              weight_version=version, pause_mode=self.pause_mode)
        remaining = functools.partial(self._remaining, deadline)
        results = await asyncio.gather(self._begin_sessions(self.plain, deadline),
                                       *(self._layouts.arm(r, payload, remaining) for r in self.armed),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            self._broken = True
            if not isinstance(results[0], BaseException):
                await self._end_sessions(results[0], deadline, raising=False)
            raise failed[0] if isinstance(failed[0], WeightSyncError) else WeightSyncError(
                f"arm_weight_update failed: {failed[0]!r}")
        ends = [asyncio.ensure_future(r.post(END_PATH, {"continue_generation": True}, self._remaining(deadline)))
                for r in self.armed]
        return results[0], ends

    async def _begin_sessions(self, receivers: list[Endpoint], deadline: float) -> list[Endpoint]:
        """`/begin_weight_update` on every engine; the ones that opened a session (404: an engine
        without sessions). A session left open by a sender that died is closed and opened again."""
        async def begin(receiver: Endpoint) -> bool:
            try:
                await receiver.post("/begin_weight_update", {}, self._remaining(deadline))
            except EndpointMissing:
                return False
            except BucketRejected as exc:
                if "already open" not in str(exc):
                    raise
                logger.warning("%s had a weight-update session open (a push that did not finish); closing it",
                               receiver)
                await receiver.post("/end_weight_update", {}, self._remaining(deadline))
                await receiver.post("/begin_weight_update", {}, self._remaining(deadline))
            return True

        results = await asyncio.gather(*(begin(r) for r in receivers), return_exceptions=True)
        opened = [r for r, result in zip(receivers, results) if result is True]
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            await self._end_sessions(opened, deadline, raising=False)
            raise failed[0] if isinstance(failed[0], WeightSyncError) else WeightSyncError(
                f"begin_weight_update failed: {failed[0]!r}")
        return opened

    async def _end_sessions(self, receivers: list[Endpoint], deadline: float, *, raising: bool) -> None:
        """`/end_weight_update` where a session was opened. After a failed push the failures are
        logged, not raised over the push's own error."""
        remaining = max(deadline - time.monotonic(), 5.0)
        results = await asyncio.gather(*(r.post("/end_weight_update", {}, remaining) for r in receivers),
                                       return_exceptions=True)
        for receiver, result in zip(receivers, results):
            if isinstance(result, BaseException):
                if raising:
                    raise result if isinstance(result, WeightSyncError) else WeightSyncError(
                        f"{receiver}/end_weight_update: {result!r}")
                logger.warning("end_weight_update on %s failed: %s", receiver, result)

    def _staging_for(self, nbytes: int, device: Any) -> torch.Tensor | None:
        """The push's flat-bucket buffer on a GPU (one allocation reused by every bucket, so a
        receiver opens one IPC handle per push; ipc.py), grown to `nbytes` if a bucket is larger."""
        if device is None or torch.device(device).type != "cuda":
            return None
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = None  # a receiver may still hold the old one open: IPC ref counts free it
            self._staging = torch.empty(max(nbytes, self.bucket_bytes), dtype=torch.uint8, device=device)
        return self._staging

    def _ipc_tasks(self, named: list[tuple[str, torch.Tensor]], device: Any, weight_version: str | None,
                   remaining: float, last: bool) -> list[asyncio.Future]:
        """`/update_weights_from_tensor` to every receiver on this GPU: handles to `named` (kept
        alive by the caller until they answer), one payload per tensor-parallel rank (ipc.py)."""
        staging = self._staging_for(sum(tensor_bytes(t) for _, t in named), device)
        bucket, load_format = encode_bucket(named, out=staging)
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the handles' bytes are written
        return [asyncio.ensure_future(r.post("/update_weights_from_tensor", tensor_payload(
            bucket, load_format, copies=tp, weight_version=weight_version, serializer=self.serializer,
            flush_cache=last), remaining)) for r, tp in self.ipc_receivers]

    def _group_tasks(self, named: list[tuple[str, torch.Tensor]], index: int, weight_version: str | None,
                     remaining: float, last: bool) -> list[asyncio.Future]:
        """`/update_weights_from_distributed` to every receiver in the group, and the broadcast
        (after the previous bucket's: `chain.BroadcastChain`): one per tensor, or one of the bucket's bytes
        packed into a flat buffer (`flat`)."""
        tensors = [t for _, t in named]
        payload = {"names": [n for n, _ in named], "dtypes": [dtype_name(t.dtype) for t in tensors],
                   "shapes": [list(t.shape) for t in tensors], "group_name": self.group_name, "flush_cache": last}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        if self.depth > 1:  # receivers that take pipelined buckets in order (SGLang never gets the field)
            payload["bucket_index"] = index
        if self.flat:
            payload["load_format"] = FLAT_BYTES
        tasks = [asyncio.ensure_future(r.post("/update_weights_from_distributed", payload, remaining))
                 for r in self.posted]  # (armed receivers take the broadcast with no request)
        return tasks + [self._chain.add(self._group, tensors, pack=self.flat)]

    def _launch(self, bucket: list[tuple[str, torch.Tensor]], index: int, weight_version: str | None,
                deadline: float) -> _Flight:
        """Put bucket `index` on its way (the last one carries the version and flushes the caches)."""
        device = self._group.device if self._group is not None else self.device
        named = [(n, t.detach()) for n, t in bucket]
        if self.ipc_receivers or not self.flat:  # (a flat bucket is packed from the tensors as they are)
            named = [(n, t.to(device).contiguous()) for n, t in named]
        remaining, last = self._remaining(deadline), weight_version is not None
        tasks: list[asyncio.Future] = []
        if self.ipc_receivers:
            tasks += self._ipc_tasks(named, device, weight_version, remaining, last)
        if self.group_receivers:
            tasks += self._group_tasks(named, index, weight_version, remaining, last)
        return _Flight(tasks, sum(tensor_bytes(t) for _, t in named))

    async def _land(self, flights: deque[_Flight], deadline: float, ends: Sequence[asyncio.Future] = ()) -> int:
        """Wait for the oldest bucket in flight; its bytes. A rejected bucket is settled with every
        other one in flight (the group stays usable once all receivers are done), then raised. An
        armed receiver's end call failing meanwhile (`ends`: its loop stopped) raises at once."""
        flight = flights[0]
        try:
            await watched(self._wait_all(flight.tasks, deadline, "update_weights_from_distributed"), ends)
            if self.ipc_receivers and torch.cuda.is_available():  # receivers dropped their handles: free the blocks
                torch.cuda.ipc_collect()
        except BucketRejected as rejected:
            await self._settle([t for f in flights for t in f.tasks], deadline)
            flights.clear()
            raise rejected
        except WeightSyncError:
            self._broken = True
            raise
        flights.popleft()
        return flight.nbytes

    async def _settle(self, tasks: list[asyncio.Future], deadline: float) -> None:
        """After a BucketRejected: wait for the broadcast and the other engines; anything worse breaks the group."""
        done, pending = await asyncio.wait(tasks, timeout=max(deadline - time.monotonic(), 0))
        worse = [t.exception() for t in done if not t.cancelled() and t.exception() is not None
                 and not isinstance(t.exception(), BucketRejected)]
        if pending or worse:
            self._broken = True
            for task in pending:
                task.cancel()
            raise worse[0] if worse else WeightSyncError(
                f"update_weights_from_distributed did not finish within the {self.timeout_s:.0f}s deadline")

    async def _resume_engines(self, receivers: list[Endpoint]) -> None:
        """Best effort: a failed resume is logged, not raised over the push's own error."""
        results = await asyncio.gather(*(r.post("/continue_generation", {}, 30.0) for r in receivers),
                                       return_exceptions=True)
        for receiver, result in zip(receivers, results):
            if isinstance(result, Exception):
                logger.warning("continue_generation on %s failed: %s", receiver, result)

    async def close(self) -> None:
        """Destroy the group on the engines and here, at the same time (an NCCL group's shutdown
        waits for every rank's: destroying here only after the engines answered deadlocked until
        the 30 s timeout); safe to call twice."""
        self._connected = False
        if self._group is not None:
            group, self._group = self._group, None
            # (this rank's shutdown has the same bound as the engines' answer: a gloo group's shutdown
            # with a peer gone mid-close could block a topology change for ever)
            drop = group.abort if self._broken else group.destroy  # (a broken NCCL group may hold a broadcast)
            local = [asyncio.wait_for(run_in_daemon_thread(drop), CLOSE_TIMEOUT_S)]
            results = await asyncio.gather(*(r.post("/destroy_weights_update_group",
                                                    {"group_name": self.group_name}, CLOSE_TIMEOUT_S)
                                             for r in self.group_receivers), *local, return_exceptions=True)
            for receiver, result in zip([*self.group_receivers, "this rank"], results):
                if isinstance(result, Exception):
                    logger.warning("destroy_weights_update_group on %s failed: %s: %s", receiver,
                                   type(result).__name__, result)
        await asyncio.gather(*(r.close() for r in self.receivers if isinstance(r, HTTPEndpoint)))
