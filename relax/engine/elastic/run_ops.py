"""`FleetOps` of the Rollout's engine fleet in a run, from the Rollout's own process.

The fleet's operations are local (`LocalFleetOps` over the Rollout's `EngineFleet`); what concerns
weights goes through the run's other roles, as the HealthManager's engine replacements do
(`RunWeights`, over the Serve handles of the Actor and the DCS coordinator the Controller gave the
Rollout):
- `sync`: the DCS coordinator lists the new topology, the Actor pushes the weights its ranks hold now
  to the new engines alone (`restore_weights`), and the engines are checked to hold that version
  before they join the router;
- drain, undrain, abandon: the coordinator's topology changes at once (a drained engine leaves it, so
  no weight push waits on it);
- `release`: only once no weight push that may still include the engine is in flight
  (`settle_weights`).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from relax.config.roles import Role
from relax.distributed.checkpoint_service.coordinator import Receivers
from relax.engine.elastic.local_ops import LocalFleetOps


class Weights(Protocol):
    """The run's weight-sync side of a fleet change (`RunWeights`; a stand-in in tests)."""

    async def register(self, receivers: Receivers) -> None: ...  # the Rollout's receivers are now these
    async def restore(self, urls: list[str], devices: list[Any]) -> int | None: ...  # weights to `urls`; version
    async def settle(self) -> None: ...  # until no weight push is in flight


class RunWeights:
    """`Weights` through the Actor and the DCS coordinator (Serve deployment handles)."""

    def __init__(self, actor: Any, coordinator: Any) -> None:
        self.actor, self.coordinator = actor, coordinator

    async def register(self, receivers: Receivers) -> None:
        await self.coordinator.register.remote(Role.ROLLOUT, receivers)

    async def restore(self, urls: list[str], devices: list[Any]) -> int | None:
        stats = await self.actor.restore_weights.remote(urls, devices)
        version = stats.get("weight_sync/version")
        return None if version is None else int(version)

    async def settle(self) -> None:
        await self.actor.settle_weights.remote()


class RunFleetOps:
    """`FleetOps` (module doc). `receivers()`: the Rollout's weight receivers now (draining engines left out)."""

    def __init__(self, local: LocalFleetOps, weights: Weights, receivers: Callable[[], Receivers]) -> None:
        self.local, self.weights, self.receivers = local, weights, receivers

    async def engines(self) -> list[dict[str, Any]]:
        return await self.local.engines()

    async def capacity(self) -> int | None:
        return await self.local.capacity()

    async def launch(self, count: int, timeout: float, tag: str) -> list[dict[str, str]]:
        return await self.local.launch(count, timeout, tag)

    async def register(self, address: str, timeout: float, tag: str) -> dict[str, str]:
        return await self.local.register(address, timeout, tag)

    async def sync(self, urls: list[str]) -> int | None:
        """The new engines join the coordinator's topology, get the Actor's weights, and are checked."""
        receivers = await self._topology_changed()
        devices = [receivers.devices[receivers.endpoints.index(u)] for u in urls]
        return await self.local.verify(urls, await self.weights.restore(urls, devices))

    async def admit(self, url: str) -> None:
        await self.local.admit(url)

    async def abandon(self, tag: str) -> list[str]:
        gone = await self.local.abandon(tag)
        await self._topology_changed()
        return gone

    async def drain(self, url: str) -> None:
        await self.local.drain(url)
        await self._topology_changed()  # out of the topology: no push waits on it

    async def undrain(self, url: str) -> None:
        await self.local.undrain(url)
        await self._topology_changed()

    async def in_flight(self, url: str) -> int:
        return await self.local.in_flight(url)

    async def evict(self, url: str) -> int:
        return await self.local.evict(url)

    async def release(self, url: str, timeout: float) -> None:
        await self.weights.settle()  # no push that still includes it is in flight when it stops
        await self.local.release(url, timeout)

    async def load(self) -> dict[str, dict[str, float]]:
        """Per serving engine: requests in flight and seconds spent decoding so far (the autoscaler's signals)."""
        return await self.local.load()

    async def _topology_changed(self) -> Receivers:
        receivers = self.receivers()
        await self.weights.register(receivers)
        return receivers
