"""Fleet operations as typed calls that travel to the process owning the fleet.

The Rollout role owns the engine fleet; the scaler runs beside the Controller (`relax.core.elastic`),
which also reaches the Actor and the DCS coordinator for weights. Each `FleetOps` method is one
frozen dataclass here, sent through the Rollout's one entry point (`Rollout.fleet_call(call)`) and
applied to its `LocalFleetOps` there: the calls are typed at both ends, and the Rollout does not grow
a method per operation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from relax.engine.elastic.local_ops import LocalFleetOps

T = TypeVar("T")


@dataclass(frozen=True)
class Engines:
    async def apply(self, ops: LocalFleetOps) -> list[dict[str, Any]]:
        return await ops.engines()


@dataclass(frozen=True)
class Capacity:
    async def apply(self, ops: LocalFleetOps) -> int | None:
        return await ops.capacity()


@dataclass(frozen=True)
class Launch:
    count: int
    timeout: float
    tag: str

    async def apply(self, ops: LocalFleetOps) -> list[dict[str, str]]:
        return await ops.launch(self.count, self.timeout, self.tag)


@dataclass(frozen=True)
class Register:
    address: str
    timeout: float
    tag: str

    async def apply(self, ops: LocalFleetOps) -> dict[str, str]:
        return await ops.register(self.address, self.timeout, self.tag)


@dataclass(frozen=True)
class Verify:
    """Check `urls` hold weight version `version` (or the serving engines' when None)."""

    urls: tuple[str, ...]
    version: int | None

    async def apply(self, ops: LocalFleetOps) -> int:
        return await ops.verify(list(self.urls), self.version)


@dataclass(frozen=True)
class Abandon:
    tag: str

    async def apply(self, ops: LocalFleetOps) -> list[str]:
        return await ops.abandon(self.tag)


@dataclass(frozen=True)
class OnEngine(Generic[T]):
    """One engine's operation: `op` (a LocalFleetOps method taking the engine's url, such as
    `LocalFleetOps.drain`) applied to `url`."""

    op: Callable[[LocalFleetOps, str], Awaitable[T]]
    url: str

    async def apply(self, ops: LocalFleetOps) -> T:
        return await self.op(ops, self.url)


@dataclass(frozen=True)
class Release:
    url: str
    timeout: float

    async def apply(self, ops: LocalFleetOps) -> None:
        await ops.release(self.url, self.timeout)


@dataclass(frozen=True)
class Load:
    """Per engine: requests in flight and seconds spent decoding so far (the autoscaler's signals)."""

    async def apply(self, ops: LocalFleetOps) -> dict[str, dict[str, float]]:
        return await ops.load()


FleetCall = Engines | Capacity | Launch | Register | Verify | Abandon | OnEngine | Release | Load
