"""The broadcast group a weight push runs over, and the thread its blocking calls run in.

`create_weight_group` builds a process group directly from a `TCPStore` + `PrefixStore`,
never touching torch.distributed's default group (the trainer already has one for FSDP;
the engine has none). Both sides of the protocol (`protocol.py`) use it: the sender as rank 0,
every receiver as rank `rank_offset`. The group's store listens on loopback unless an engine is
on another host (`group_master_address`).

A broadcast has no timeout of its own on NCCL, so the sender and the receivers run joins and
broadcasts in a daemon thread (`run_in_daemon_thread`) and wait on it with their own deadline.
With `--enable-cuda-memory-check` each broadcast logs the GPU's free memory first and a failed one
carries the memory state (`relax.utils.memory_check`; a no-op otherwise).
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import threading
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from relax.distributed.store import BIND_ENV, address_towards, is_loopback, tcp_store
from relax.distributed.weights.protocol import WeightSyncError
from relax.utils import memory_check


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
        with memory_check.collective(f"weight broadcast ({self.group_name})"):
            self._broadcast(tensor, src).wait()

    def broadcast_queued(self, tensor: torch.Tensor, src: int = 0) -> Any:
        """Start a broadcast and return its work handle. On NCCL it runs after what the current
        stream has queued, and nothing waits for it until the handle's `wait()` (which makes the
        then-current stream wait)."""
        with memory_check.collective(f"weight broadcast, queued ({self.group_name})"):
            return self._broadcast(tensor, src)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> Any:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        return self._pg.broadcast([tensor], opts)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def destroy(self) -> None:
        pg, self._pg, self._store = self._pg, None, None
        if pg is not None and hasattr(pg, "shutdown"):
            pg.shutdown()

    def abort(self) -> None:
        """Drop a broken group now. On NCCL its communicators are aborted, which ends a broadcast that no
        receiver will take (its kernel would wait on the GPU, and NCCL's watchdog end the process at the
        group's timeout); gloo's abort does not end a pending broadcast, so a gloo group is just dropped
        (its daemon thread fails at the timeout)."""
        pg, self._pg, self._store = self._pg, None, None
        if pg is not None and self.backend == "nccl":
            pg.abort()


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
