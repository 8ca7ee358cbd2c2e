"""`FleetOps` over an `EngineFleet` in this process: what the run's scaler uses under `run_ops.RunFleetOps`
in the Rollout role, and what unit tests and benches drive directly.

Weights: `sync(urls)` is given by the owner (in a run, `RunFleetOps` has the Actor push its weights through
the DCS coordinator, then `verify`); without one the new engines keep the weights they loaded, and
`sync` checks they report the version the others hold. Eviction of a drained engine's last requests:
with --partial-rollout the engine aborts them (each comes back with the tokens generated so far and is
resumed on another engine, tokens kept); otherwise the router cancels them and sends each whole to
another engine.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, Protocol

from relax.engine.fleet import EngineFleet
from relax.engine.rollout.generator import parse_weight_version
from relax.utils.poll import Backoff

CPU_OVERSUBSCRIPTION = 4  # engine threads per core a CPU host takes (decoding waits on memory, not ALUs)

Sync = Callable[[list[str]], Awaitable["int | None"]]


def cpu_room(cores: int, threads_per_engine: int, engines: int) -> int:
    """More CPU engines this host has room for: `CPU_OVERSUBSCRIPTION` engine threads per core."""
    return max(0, cores * CPU_OVERSUBSCRIPTION // max(1, threads_per_engine) - engines)


class Gpus(Protocol):
    """Where added engines get their GPUs on a GPU cluster (`relax.distributed.ray.elastic_gpus.ElasticGpus`)."""

    def room(self) -> int: ...
    def acquire(self, timeout_s: float) -> str: ...
    def release(self, device: str | None) -> None: ...
    def release_all(self) -> None: ...
    def identities(self) -> dict[str, tuple[str, ...]]: ...


class LocalFleetOps:
    """`gpus`: on a GPU cluster, where added engines get their GPUs (and give them back when they
    leave or their operation is undone); None on CPU, where an engine is threads of this host."""

    def __init__(self, fleet: EngineFleet, sync: Sync | None = None, *, partial_rollout: bool = False,
                 capacity: Callable[[], "int | None"] | None = None, gpus: Gpus | None = None) -> None:
        self.fleet, self._sync, self.partial_rollout, self.gpus = fleet, sync, partial_rollout, gpus
        self._capacity = capacity or (gpus.room if gpus is not None else (
            lambda: cpu_room(os.cpu_count() or 1, fleet.spec.threads, len(fleet.engines))))
        self._devices: dict[str, list[str]] = {}  # operation tag -> GPUs held for the engines it launched

    async def engines(self) -> list[dict[str, Any]]:
        return self.fleet.table()

    async def capacity(self) -> int | None:
        return self._capacity()

    async def launch(self, count: int, timeout: float, tag: str) -> list[dict[str, str]]:
        if self.gpus is None:
            return await self.fleet.launch(count, timeout, tag)
        devices: list[str] = []
        try:
            for _ in range(count):
                devices.append(await asyncio.to_thread(self.gpus.acquire, timeout))
        except RuntimeError as exc:  # fewer GPUs than asked: those engines fail, the policy decides
            failed = [{"error": str(exc)}] * (count - len(devices))
        else:
            failed = []
        self._devices.setdefault(tag, []).extend(devices)
        results = await self.fleet.launch(len(devices), timeout, tag, devices=devices) if devices else []
        for device, result in zip(devices, results):
            if "error" in result:
                self.gpus.release(device)
        return list(results) + failed

    async def register(self, address: str, timeout: float, tag: str) -> dict[str, str]:
        return await self.fleet.register(address, timeout, tag)

    async def sync(self, urls: list[str]) -> int | None:
        """The current weights to `urls` (the owner's `sync`), then `verify`."""
        return await self.verify(urls, await self._sync(urls) if self._sync is not None else None)

    async def verify(self, urls: list[str], version: int | None) -> int:
        """Check each of `urls` holds weight version `version` (None: the oldest the serving engines
        hold); RuntimeError naming the engine otherwise. Returns the version checked."""
        others = [u for u in self.fleet.urls if u not in urls and u not in self.fleet.draining]
        want = version if version is not None else min(
            [parse_weight_version(await self.fleet.clients[u].get_weight_version()) for u in others], default=0)
        for url in urls:
            held = parse_weight_version(await self.fleet.clients[url].get_weight_version())
            if held < want:
                raise RuntimeError(f"new engine {url} holds weight version {held}, the fleet {want}: it would "
                                   "serve stale weights, so it does not join")
        return want

    async def load(self) -> dict[str, dict[str, float]]:
        """Per serving engine: requests in flight at the router and seconds spent decoding so far."""
        busy = await self.fleet.busy_seconds()
        return {url: {"in_flight": float(self.fleet.in_flight_at(url)), "busy_seconds": busy.get(url, 0.0)}
                for url in self.fleet.urls if url not in self.fleet.draining}

    async def admit(self, url: str) -> None:
        await self.fleet.admit(url)

    async def abandon(self, tag: str) -> list[str]:
        joined = await self.fleet.abandon(tag)
        for device in self._devices.pop(tag, []) if self.gpus is not None else []:
            self.gpus.release(device)
        return joined

    async def drain(self, url: str) -> None:
        self.fleet.drain(url)

    async def undrain(self, url: str) -> None:
        self.fleet.undrain(url)

    async def in_flight(self, url: str) -> int:
        return self.fleet.in_flight_at(url)

    async def evict(self, url: str) -> int:
        """The requests still running on drained `url` go to the other engines (module doc); how many."""
        running = self.fleet.in_flight_at(url)
        if self.partial_rollout and running:
            await self.fleet.clients[url].abort_request(abort_all=True)  # replies come back with their tokens
            backoff = Backoff(max_s=0.1)
            for _ in range(30):
                if not self.fleet.in_flight_at(url):
                    return running
                await backoff.wait()
        self.fleet.evict(url)
        return running

    async def release(self, url: str, timeout: float) -> None:
        device = self.fleet.device_of(url)
        await self.fleet.release(url, timeout)
        if self.gpus is not None:
            self.gpus.release(device)  # (a startup engine's GPUs are the run's: not held here, kept)
