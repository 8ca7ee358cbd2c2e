"""Trainer -> inference-engine weight push over a torch.distributed broadcast group (SGLang protocol).

Protocol (the one SGLang serves and slime drives):
1. `connect()`: the trainer picks a free port and POSTs `/init_weights_update_group`
   {master_address, master_port, rank_offset=1+i, world_size=1+n, group_name, backend} to every
   engine while joining the same group as rank 0 itself. The group listens on loopback unless an
   engine is on another host (an external engine): then on this host's address towards it.
2. `push(named_tensors, version=v)`: `/pause_generation` and `/flush_cache` on every engine,
   `/begin_weight_update` (SGLang >= 0.5.23 loads weights only inside such a session; an
   engine that answers 404 predates sessions and is pushed to without one), then per bucket of
   at most `bucket_bytes` a POST `/update_weights_from_distributed`
   {names, dtypes, shapes, group_name, flush_cache, weight_version} to every engine while rank 0
   broadcasts each tensor of the bucket, in order; then `/end_weight_update` (SGLang finalizes
   the loaded weights there) and `/continue_generation`.
   `weight_version` rides on the last bucket only, so an engine reports the new version only
   once it holds all of it.
3. `close()`: `/destroy_weights_update_group` and the local group is dropped.

Failure handling: a broadcast has no timeout of its own on NCCL, so it runs in a worker thread
and the HTTP replies are the waiters (as TRL does): an engine that rejects a bucket raises
`WeightSyncError` with the engine's message at once; everything has the deadline `timeout_s`.
If a broadcast was left unfinished the group is marked broken and the next push asks for a
reconnect. After a failed push the engines are resumed (they keep serving the weights they
have, which may be partly new); the caller decides whether to retry.

`create_weight_group` builds a process group directly from a `TCPStore` + `PrefixStore`,
never touching torch.distributed's default group (the trainer already has one for FSDP;
the engine has none). The engine side of the protocol uses the same function.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from relax.utils.http_utils import CLIENT_KEEP_ALIVE_S, IDEMPOTENT_PATHS, TRANSPORT_RETRIES, error_message
from relax.distributed.store import BIND_ENV, address_towards, is_loopback, listen, tcp_store

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024  # --update-weight-buffer-size default


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}
MAX_TENSORS_PER_REQUEST = 100_000


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def parse_dtype(name: str) -> torch.dtype:
    key = name.removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[key]


def parse_specs(names: list[str], dtypes: list[str], shapes: list[list[int]]) -> list[TensorSpec]:
    """Validate the request lists (same length, known dtypes, non-negative dims)."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(f"names, dtypes and shapes must have the same length, "
                         f"got {len(names)}, {len(dtypes)}, {len(shapes)}")
    if not names:
        raise ValueError("names is empty: nothing to update")
    if len(names) > MAX_TENSORS_PER_REQUEST:
        raise ValueError(f"at most {MAX_TENSORS_PER_REQUEST} tensors per request, got {len(names)}")
    specs = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor {name!r}: negative dimension in shape {shape}")
        specs.append(TensorSpec(name, parse_dtype(dtype), tuple(shape)))
    return specs



class WeightSyncError(RuntimeError):
    """A weight push failed; the message names the engine and what it said."""


class BucketRejected(WeightSyncError):
    """An engine replied `success: false`: it received the whole bucket, then refused to load it.

    SGLang and the hf engine only answer this way after the broadcast, so the group is still in
    step. Any other failure (4xx/5xx without `success`, timeout, lost connection) may leave
    bytes on the wire, and the group must be rebuilt.
    """


class EndpointMissing(WeightSyncError):
    """The engine answered 404: it does not serve this endpoint (an older SGLang)."""


@dataclass(frozen=True)
class SyncStats:
    """One push: bytes sent, wall seconds, gbps = gigabytes (1e9 B) per second, buckets, version."""

    bytes: int
    seconds: float
    gbps: float
    num_buckets: int
    version: int


class WeightGroup:
    """A broadcast-only process group outside torch.distributed's default group.

    `device` is where this rank's tensors live (CPU for gloo, one CUDA device for nccl); it is
    fixed at creation because broadcasts run in worker threads whose current CUDA device is 0.
    """

    def __init__(self, pg: Any, store: Any, *, rank: int, world_size: int, backend: str, group_name: str,
                 device: torch.device):
        self._pg, self._store = pg, store
        self.rank, self.world_size, self.backend, self.group_name = rank, world_size, backend, group_name
        self.device = device

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Blocking broadcast of `tensor` (in place on receivers) from rank `src`."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self._pg.broadcast([tensor], opts).wait()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def destroy(self) -> None:
        pg, self._pg, self._store = self._pg, None, None
        if pg is not None and hasattr(pg, "shutdown"):
            pg.shutdown()


def create_weight_group(*, master_address: str, master_port: int, rank: int, world_size: int,
                        group_name: str, backend: str = "gloo", timeout_s: float = 300.0,
                        device: torch.device | str | None = None, listener: socket.socket | None = None,
                        ) -> WeightGroup:
    """Join (rank > 0) or host (rank 0) a new broadcast group; blocks until every rank has joined.

    The store listens on `master_address` only (rank 0 may pass the `listener` socket it already
    bound to publish the port). `device`: nccl only, the CUDA device of this rank (default: the
    calling thread's current one).
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (GPU), got {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = tcp_store(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout,
                      listener=listener)
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        hostname = address_towards(master_address)
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
        device = torch.device("cpu")
    else:
        device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return WeightGroup(pg, store, rank=rank, world_size=world_size, backend=backend, group_name=group_name,
                       device=device)


def _resolves(host: str) -> bool:
    try:
        return bool(socket.getaddrinfo(host, None))
    except OSError:
        return False


def group_master_address(master_address: str, engine_urls: Sequence[Any]) -> str:
    """Where rank 0's store listens: `master_address`, unless that is loopback and an engine is on another
    host (an external engine), which could not reach it: then this host's address towards that engine."""
    hosts = [urlsplit(u).hostname or u for u in engine_urls if isinstance(u, str)]
    # (a host that does not resolve is left to the engine's HTTP call, which names it)
    remote = [h for h in hosts if not is_loopback(h) and _resolves(h)]
    if not remote or not is_loopback(master_address):
        return master_address
    try:
        return address_towards(remote[0])
    except OSError as exc:
        raise WeightSyncError(f"the weight-update group must listen where the engine at {remote[0]} can reach it, "
                              f"but no local address routes there ({exc}); set ${BIND_ENV} to this host's address "
                              "on the engines' network") from exc


def run_in_daemon_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future:
    """Run a blocking call in a fresh daemon thread; returns an awaitable future.

    Used instead of asyncio.to_thread for group joins and broadcasts: those can block until
    the group's timeout when a peer is gone, and a stuck thread in the default executor
    would also block the event loop's shutdown.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as exc:  # handed to the awaiting coroutine, not swallowed
            result, error = None, exc
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=f"weight-sync-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def iter_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                 ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors in order into buckets of at most `bucket_bytes` (a larger tensor goes alone)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _with_last(items: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """Yield (item, is_last) with one item of lookahead."""
    previous = next(items, None)
    while previous is not None:
        current = next(items, None)
        yield previous, current is None
        previous = current


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's wire name for a dtype: 'bfloat16', 'float32', ..."""
    return str(dtype).replace("torch.", "")


class _EngineHTTP:
    """The few SGLang control calls the sender needs (distributed may not import backends)."""

    def __init__(self, api_key: str | None, transport: Any = None):
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, transport=transport,
                                         limits=httpx.Limits(keepalive_expiry=CLIENT_KEEP_ALIVE_S))

    async def post(self, url: Any, path: str, payload: dict, timeout_s: float) -> Any:
        import httpx

        if not isinstance(url, str):  # a non-HTTP receiver (e.g. a Ray actor) speaking the same protocol
            return await url.post(path, payload, timeout_s)
        retries = TRANSPORT_RETRIES if path in IDEMPOTENT_PATHS else 0  # pause/continue, never the group
        for attempt in range(retries + 1):
            try:
                response = await self._client.post(url.rstrip("/") + path, json=payload,
                                                   timeout=max(timeout_s, 0.001))
                break
            except httpx.TransportError as exc:
                if attempt == retries or isinstance(exc, httpx.TimeoutException):
                    raise WeightSyncError(f"{url}{path}: {type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(0.2 * 2 ** attempt)
            except httpx.HTTPError as exc:
                raise WeightSyncError(f"{url}{path}: {type(exc).__name__}: {exc}") from exc
        body: Any = None
        if response.content:
            try:
                body = response.json()
            except ValueError:
                body = response.text
        if response.status_code == 404:
            raise EndpointMissing(f"{url}{path}: HTTP 404: {error_message(body)}")
        if isinstance(body, dict) and body.get("success") is False:
            raise BucketRejected(f"{url}{path}: HTTP {response.status_code}: {error_message(body)}")
        if response.status_code >= 400:
            raise WeightSyncError(f"{url}{path}: HTTP {response.status_code}: {error_message(body)}")
        return body

    async def close(self) -> None:
        await self._client.aclose()


class WeightSender:
    """Rank 0 of the weight group: pushes HF-named tensors to every engine (see module doc)."""

    def __init__(self, engine_urls: Sequence[Any], *, api_key: str | None = None, backend: str = "gloo",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = 300.0,
                 master_address: str = "127.0.0.1", group_name: str | None = None, transport: Any = None,
                 device: torch.device | str | None = None, pause_mode: str = "abort",
                 ipc_ranks: Sequence[int] | None = None):
        """`engine_urls`: SGLang HTTP base URLs, or receiver objects with the same protocol as
        `async post(path, payload, timeout_s)` (training-backend ranks that take weights too).
        `pause_mode`: what `/pause_generation` does to in-flight requests while weights load
        ("abort" in colocate, where none are in flight; "in_place" keeps them running on the new
        weights; partial rollout aborts and resubmits them). `ipc_ranks`, per receiver: 0 for one
        on another GPU (it joins the broadcast group), else it shares this GPU and takes CUDA IPC
        handles through `/update_weights_from_tensor`, one copy per tensor-parallel rank."""
        if not engine_urls:
            raise ValueError("WeightSender needs at least one engine URL")
        self.engine_urls = [u.rstrip("/") if isinstance(u, str) else u for u in engine_urls]
        ipc = list(ipc_ranks) if ipc_ranks is not None else [0] * len(self.engine_urls)
        if len(ipc) != len(self.engine_urls):
            raise ValueError(f"ipc_ranks has {len(ipc)} entries for {len(self.engine_urls)} receivers")
        self.group_urls = [u for u, n in zip(self.engine_urls, ipc) if not n]
        self.ipc_urls = [(u, n) for u, n in zip(self.engine_urls, ipc) if n]
        self._staging: torch.Tensor | None = None  # the flat-bucket buffer of a push to ipc_urls (_staging_for)
        self.pause_mode = pause_mode
        self.backend, self.bucket_bytes, self.timeout_s = backend, bucket_bytes, timeout_s
        self.master_address, self.device = master_address, device
        self.group_name = group_name or f"relax-weights-{uuid.uuid4().hex[:8]}"
        self._api_key, self._transport = api_key, transport
        self._http: _EngineHTTP | None = None
        self._group: WeightGroup | None = None
        self._connected = False
        self._broken = False
        self._lock = asyncio.Lock()

    # ---- helpers ---------------------------------------------------------------------
    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WeightSyncError(f"weight sync exceeded its deadline of {self.timeout_s:.0f}s")
        return remaining

    async def _post_all(self, path: str, payload: dict, deadline: float) -> list[Any]:
        remaining = self._remaining(deadline)
        return await asyncio.gather(*(self._http.post(u, path, payload, remaining) for u in self.engine_urls))

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
        self._http = self._http or _EngineHTTP(self._api_key, self._transport)
        self._connected = True
        if not self.group_urls:  # every receiver shares this GPU: handles only, no group
            logger.info("weight push by CUDA IPC to %d receiver(s) on this GPU", len(self.ipc_urls))
            return
        if self.backend == "nccl" and self.device is None:  # resolve here: the join runs in another thread
            self.device = torch.device("cuda", torch.cuda.current_device())
        deadline = time.monotonic() + self.timeout_s
        self.master_address = group_master_address(self.master_address, self.group_urls)
        listener = listen(self.master_address)  # held from here: no other process can take the port
        port = listener.getsockname()[1]
        world_size = 1 + len(self.group_urls)
        http = [asyncio.ensure_future(self._http.post(url, "/init_weights_update_group", {
            "master_address": self.master_address, "master_port": port, "rank_offset": 1 + i,
            "world_size": world_size, "group_name": self.group_name, "backend": self.backend,
        }, self.timeout_s)) for i, url in enumerate(self.group_urls)]
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
                    len(self.group_urls), self.backend, port,
                    f"; {len(self.ipc_urls)} more on this GPU by CUDA IPC" if self.ipc_urls else "")

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
            await self._post_all("/pause_generation", {"mode": self.pause_mode}, deadline)
            total_bytes = num_buckets = 0
            try:
                await self._post_all("/flush_cache", {}, deadline)
                sessions = await self._begin_sessions(deadline)
                try:
                    for bucket, is_last in _with_last(iter_buckets(named_tensors, self.bucket_bytes)):
                        total_bytes += await self._push_bucket(bucket, str(version) if is_last else None, deadline)
                        num_buckets += 1
                except BaseException:
                    await self._end_sessions(sessions, deadline, raising=False)
                    raise
                await self._end_sessions(sessions, deadline, raising=True)
            finally:
                self._staging = None  # receivers let go of it at end_weight_update
                if self.ipc_urls and torch.cuda.is_available():
                    torch.cuda.ipc_collect()
                await self._resume_engines()
            if num_buckets == 0:
                raise WeightSyncError("push() got no tensors")
        seconds = time.monotonic() - start
        stats = SyncStats(bytes=total_bytes, seconds=seconds, gbps=total_bytes / max(seconds, 1e-9) / 1e9,
                          num_buckets=num_buckets, version=version)
        logger.info("weight sync v%d: %d bytes in %.3fs (%.3f GB/s, %d buckets) to %d engine(s)",
                    version, stats.bytes, stats.seconds, stats.gbps, num_buckets, len(self.engine_urls))
        return stats

    async def _begin_sessions(self, deadline: float) -> list[Any]:
        """`/begin_weight_update` on every engine; the ones that opened a session (404: an engine
        without sessions). A session left open by a sender that died is closed and opened again."""
        async def begin(url: Any) -> bool:
            try:
                await self._http.post(url, "/begin_weight_update", {}, self._remaining(deadline))
            except EndpointMissing:
                return False
            except BucketRejected as exc:
                if "already open" not in str(exc):
                    raise
                logger.warning("%s had a weight-update session open (a push that did not finish); closing it", url)
                await self._http.post(url, "/end_weight_update", {}, self._remaining(deadline))
                await self._http.post(url, "/begin_weight_update", {}, self._remaining(deadline))
            return True

        results = await asyncio.gather(*(begin(u) for u in self.engine_urls), return_exceptions=True)
        opened = [u for u, r in zip(self.engine_urls, results) if r is True]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self._end_sessions(opened, deadline, raising=False)
            raise failed[0] if isinstance(failed[0], WeightSyncError) else WeightSyncError(
                f"begin_weight_update failed: {failed[0]!r}")
        return opened

    async def _end_sessions(self, urls: list[Any], deadline: float, *, raising: bool) -> None:
        """`/end_weight_update` where a session was opened. After a failed push the failures are
        logged, not raised over the push's own error."""
        remaining = max(deadline - time.monotonic(), 5.0)
        results = await asyncio.gather(*(self._http.post(u, "/end_weight_update", {}, remaining) for u in urls),
                                       return_exceptions=True)
        for url, result in zip(urls, results):
            if isinstance(result, BaseException):
                if raising:
                    raise result if isinstance(result, WeightSyncError) else WeightSyncError(
                        f"{url}/end_weight_update: {result!r}")
                logger.warning("end_weight_update on %s failed: %s", url, result)

    def _staging_for(self, nbytes: int, device: Any) -> torch.Tensor | None:
        """The push's flat-bucket buffer on a GPU (one allocation reused by every bucket, so a
        receiver opens one IPC handle per push; ipc.py), grown to `nbytes` if a bucket is larger."""
        if device is None or torch.device(device).type != "cuda":
            return None
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = None  # a receiver may still hold the old one open: IPC ref counts free it
            self._staging = torch.empty(max(nbytes, self.bucket_bytes), dtype=torch.uint8, device=device)
        return self._staging

    async def _push_bucket(self, bucket: list[tuple[str, torch.Tensor]], weight_version: str | None,
                           deadline: float) -> int:
        device = self._group.device if self._group is not None else self.device
        tensors = [t.detach().to(device).contiguous() for _, t in bucket]
        remaining = self._remaining(deadline)
        tasks: list[asyncio.Future] = []
        if self.ipc_urls:  # receivers on this GPU open handles to `tensors` (kept alive until they answer)
            from relax.distributed.ipc import FLATTENED_BUCKET, flatten_bucket, serialize

            named = [(n, t) for (n, _), t in zip(bucket, tensors)]
            flat = flatten_bucket(named, out=self._staging_for(sum(tensor_bytes(t) for t in tensors), device))
            if device is not None and torch.device(device).type == "cuda":
                torch.cuda.current_stream(device).synchronize()  # the handles' bytes are written
            # One payload per tensor-parallel rank, each written anew (ipc.py: a payload read twice
            # would free the block under one of its readers).
            tasks += [asyncio.ensure_future(self._http.post(u, "/update_weights_from_tensor", {
                "serialized_named_tensors": [serialize(flat or named) for _ in range(tp)],
                "load_format": FLATTENED_BUCKET if flat else None, "flush_cache": False,
                "weight_version": weight_version}, remaining)) for u, tp in self.ipc_urls]
        if self.group_urls:
            payload = {"names": [n for n, _ in bucket], "dtypes": [dtype_name(t.dtype) for t in tensors],
                       "shapes": [list(t.shape) for t in tensors], "group_name": self.group_name,
                       "flush_cache": False}
            if weight_version is not None:
                payload["weight_version"] = weight_version
            tasks += [asyncio.ensure_future(self._http.post(u, "/update_weights_from_distributed", payload,
                                                            remaining)) for u in self.group_urls]
            tasks.append(run_in_daemon_thread(self._broadcast, tensors))
        try:
            await self._wait_all(tasks, deadline, "update_weights_from_distributed")
            if self.ipc_urls and torch.cuda.is_available():  # receivers dropped their handles: free the blocks
                torch.cuda.ipc_collect()
        except BucketRejected as rejected:
            await self._settle(tasks, deadline)  # the group stays usable once every receiver is done
            raise rejected
        except WeightSyncError:
            self._broken = True
            raise
        return sum(tensor_bytes(t) for t in tensors)

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

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            self._group.broadcast(tensor, src=0)
        self._group.synchronize()

    async def _resume_engines(self) -> None:
        """Best effort: a failed resume is logged, not raised over the push's own error."""
        results = await asyncio.gather(*(self._http.post(u, "/continue_generation", {}, 30.0)
                                         for u in self.engine_urls), return_exceptions=True)
        for url, result in zip(self.engine_urls, results):
            if isinstance(result, Exception):
                logger.warning("continue_generation on %s failed: %s", url, result)

    async def close(self) -> None:
        """Destroy the group on the engines and here, at the same time (an NCCL group's shutdown
        waits for every rank's: destroying here only after the engines answered deadlocked until
        the 30 s timeout); safe to call twice."""
        self._connected = False
        if self._group is not None:
            group, self._group = self._group, None
            local = [] if self._broken else [run_in_daemon_thread(group.destroy)]
            results = await asyncio.gather(*(self._http.post(u, "/destroy_weights_update_group",
                                                             {"group_name": self.group_name}, 30.0)
                                             for u in self.group_urls), *local, return_exceptions=True)
            for url, result in zip([*self.group_urls, "this rank"], results):
                if isinstance(result, Exception):
                    logger.warning("destroy_weights_update_group on %s failed: %s", url, result)
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()


def expert_views(targets: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names of fused MoE expert weights, as views into them. transformers >= 5 holds
    a layer's experts as `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first) and
    `mlp.experts.down_proj` [E, H, I]; checkpoints, SGLang and the megatron backend's push name
    them per expert (`mlp.experts.{e}.gate_proj.weight`, ...). Writing a view writes the weight."""
    views: dict[str, torch.Tensor] = {}
    for name, t in targets.items():
        prefix, _, leaf = name.rpartition(".")
        if not prefix.endswith("mlp.experts") or t.dim() != 3:
            continue
        for e in range(t.shape[0]):
            if leaf == "gate_up_proj":
                gate, up = t[e].chunk(2, dim=0)
                views[f"{prefix}.{e}.gate_proj.weight"], views[f"{prefix}.{e}.up_proj.weight"] = gate, up
            elif leaf == "down_proj":
                views[f"{prefix}.{e}.down_proj.weight"] = t[e]
    return views


def hf_targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor an HF-named weight can be written to: buffers, parameters (tied aliases too)
    and per-expert views of fused MoE experts (`expert_views`)."""
    targets = dict(model.named_buffers(remove_duplicate=False))
    targets.update(model.named_parameters(remove_duplicate=False))
    targets.update(expert_views(targets))
    return targets


@torch.no_grad()
def load_hf_named(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Write HF-named weights (checkpoint or in-memory names, experts fused or per expert) into an
    HF model; ValueError naming what it does not have or what is left unwritten."""
    targets = hf_targets(model)
    unknown = sorted(set(state) - set(targets))
    if unknown:
        raise ValueError(f"{len(unknown)} weight(s) are not the model's, e.g. {unknown[:3]}")
    written = 0
    for name, tensor in state.items():
        targets[name].copy_(tensor)
        written += tensor.numel()
    total = sum(p.numel() for p in model.parameters())
    if written < total:
        raise ValueError(f"the weights cover {written} of the model's {total} parameter values")


class WeightReceiver:
    """Receiving side of the push (the `hf` engine; the fsdp backend's ranks subclass `load`):
    holds the weight groups and loads received tensors into the model.

    `step_lock` (the engine's) is held while tensors are copied in, so no forward sees half a
    bucket. A well-formed bucket is always received in full; names or shapes the model does not
    have reject it whole (nothing loaded)."""

    def __init__(self, model: torch.nn.Module, *, step_lock: threading.Lock | None = None, timeout_s: float = 600.0,
                 device: torch.device | str = "cpu"):
        self.model, self.timeout_s = model, timeout_s
        self.step_lock = step_lock if step_lock is not None else contextlib.nullcontext()
        self.device = torch.device(device)
        self.groups: dict[str, WeightGroup] = {}
        self._walk: dict[str, torch.Tensor] | None = None  # _targets() of the bucket in hand (_one_walk)
        # Groups out of step after a request we refused before receiving: the sender may have
        # pushed bytes we never read, so receiving on them again could misparse (and gloo aborts
        # the process on a size mismatch). Kept referenced, never used, until destroyed.
        self.quarantined: dict[str, WeightGroup] = {}

    def init_group(self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
                   group_name: str, backend: str) -> str:
        """Blocking join; returns a message. Raises ValueError for a request that cannot work."""
        if group_name in self.groups or group_name in self.quarantined:
            raise ValueError(f"weight update group {group_name!r} already exists; destroy it first")
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError("backend 'nccl' needs an engine on a CUDA device; use backend 'gloo' on CPU")
        self.groups[group_name] = create_weight_group(
            master_address=master_address, master_port=master_port, rank=rank_offset, world_size=world_size,
            group_name=group_name, backend=backend, timeout_s=self.timeout_s,
            device=self.device if backend == "nccl" else None)
        return f"joined weight update group {group_name!r} as rank {rank_offset} of {world_size}"

    def destroy_group(self, group_name: str) -> str:
        group = self.groups.pop(group_name, None)
        if group is not None:
            group.destroy()
        elif self.quarantined.pop(group_name, None) is None:
            raise ValueError(f"no weight update group named {group_name!r}; known: {sorted(self.groups)}")
        return f"destroyed weight update group {group_name!r}"

    def quarantine(self, group_name: str) -> None:
        if group_name in self.groups:
            self.quarantined[group_name] = self.groups.pop(group_name)

    def group(self, group_name: str) -> WeightGroup:
        if group_name in self.quarantined:
            raise ValueError(f"weight update group {group_name!r} is out of step after a rejected request; "
                             "destroy it and call /init_weights_update_group again")
        if group_name not in self.groups:
            raise ValueError(f"no weight update group named {group_name!r}; call /init_weights_update_group "
                             f"first (known: {sorted(self.groups)})")
        return self.groups[group_name]

    def _targets(self) -> dict[str, torch.Tensor]:
        return hf_targets(self.model)

    def _bucket_targets(self) -> dict[str, torch.Tensor]:
        """`_targets()`, walked once per bucket (`_one_walk`): a module walk costs ~1 ms on a
        36-layer model, and checking, placing and loading a bucket asked for it three times."""
        return self._walk if self._walk is not None else self._targets()

    @contextlib.contextmanager
    def _one_walk(self) -> Iterator[None]:
        self._walk = self._targets()
        try:
            yield
        finally:
            self._walk = None

    def problems(self, specs: list[TensorSpec]) -> list[str]:
        """Names the model does not have and shapes that do not match it."""
        targets, found = self._bucket_targets(), []
        for spec in specs:
            target = targets.get(spec.name)
            if target is None:
                found.append(f"{spec.name!r} is not a parameter of the model")
            elif tuple(target.shape) != spec.shape:
                found.append(f"{spec.name!r} has shape {list(spec.shape)}, the model has {list(target.shape)}")
        return found

    def receive(self, specs: list[TensorSpec], group: WeightGroup) -> list[torch.Tensor]:
        """Blocking: receive every tensor of the bucket, in order, from rank 0."""
        received = []
        for spec in specs:
            tensor = torch.empty(spec.shape, dtype=spec.dtype, device=group.device)
            group.broadcast(tensor, src=0)
            received.append(tensor)
        group.synchronize()
        return received

    def load(self, specs: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
        targets = self._bucket_targets()
        with self.step_lock, torch.no_grad():
            for spec, tensor in zip(specs, tensors):
                targets[spec.name].copy_(tensor)

    def load_named(self, named: list[tuple[str, torch.Tensor]]) -> tuple[bool, str]:
        """`/update_weights_from_tensor`: tensors already here (opened CUDA IPC handles); checked
        like a received bucket, then copied in. Returns SGLang's (success, message)."""
        specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in named]
        with self._one_walk():
            problems = self.problems(specs)
            if problems:
                return False, f"rejected {len(specs)} tensors, nothing loaded: " + "; ".join(problems)
            self.load(specs, [t for _, t in named])
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # done reading the sender's memory
        return True, f"loaded {len(specs)} tensors by CUDA IPC"

    def _in_place(self, specs: list[TensorSpec], group: WeightGroup) -> list[torch.Tensor | None]:
        """Per spec, the model tensor the bytes can be received straight into (same dtype, shape,
        device, contiguous), else None (received into scratch, then copied in)."""
        targets = self._bucket_targets()
        direct = []
        for spec in specs:
            t = targets[spec.name]
            ok = (t.dtype == spec.dtype and tuple(t.shape) == spec.shape and t.device == group.device
                  and t.is_contiguous())
            direct.append(t if ok else None)
        return direct

    def receive_and_load(self, specs: list[TensorSpec], group_name: str) -> tuple[bool, str]:
        """Blocking; returns SGLang's (success, message). A bucket that fits the model is received
        under the step lock straight into the model's tensors where their layout allows (no
        scratch copy: on GPUs that copy costs as much as the broadcast). A subclass whose `load`
        transforms (shards) receives into scratch and loads after."""
        with self._one_walk():
            return self._receive_and_load(specs, self.group(group_name))

    def _receive_and_load(self, specs: list[TensorSpec], group: WeightGroup) -> tuple[bool, str]:
        problems = self.problems(specs)
        if problems:
            self.receive(specs, group)  # the sender is blocked in the broadcast: take the bytes, load nothing
            return False, f"rejected the bucket of {len(specs)} tensors, nothing loaded: " + "; ".join(problems)
        if type(self).load is not WeightReceiver.load:
            tensors = self.receive(specs, group)
            self.load(specs, tensors)
        else:
            direct, targets = self._in_place(specs, group), self._bucket_targets()
            with self.step_lock, torch.no_grad():
                tensors = [t if t is not None else torch.empty(s.shape, dtype=s.dtype, device=group.device)
                           for s, t in zip(specs, direct)]
                for tensor in tensors:
                    group.broadcast(tensor, src=0)
                group.synchronize()
                for spec, target, tensor in zip(specs, direct, tensors):
                    if target is None:
                        targets[spec.name].copy_(tensor)
        nbytes = sum(math.prod(s.shape) * t.element_size() for s, t in zip(specs, tensors))
        return True, f"loaded {len(specs)} tensors ({nbytes} bytes)"
