"""The DCS coordinator: registration, topology and weight metadata (a Serve app, one replica).

State is small and in memory: each role's `Receivers` (endpoints, the GPUs each holds its weights
on, and the cadence it takes weights at), a topology version bumped on every change (senders
compare it to the one their groups were built for), and the metadata of the last published
weights. Nothing here moves tensors; the sender and the receivers do.

Receivers are grouped into lanes by cadence: lane 1 takes every push (the engines, ActorFwd's
ranks), lane N every N-th version (the Reference with `--ref-update-interval N`). The Actor keeps
one weight group per lane and pushes to the lanes due at a version (`lane_due`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Receivers:
    """One role's weight receivers: engine URLs or ranks behind Ray handles (`RayEndpoint`), per
    endpoint the GPUs it holds weights on (the sender uses CUDA IPC for those on its own GPU), and
    the cadence: weights every `every` versions."""

    endpoints: list[Any]
    devices: list[tuple[str, ...]] = field(default_factory=list)
    every: int = 1

    def __post_init__(self) -> None:
        if not self.devices:
            self.devices = [()] * len(self.endpoints)
        if len(self.devices) != len(self.endpoints):
            raise ValueError(f"{len(self.devices)} device lists for {len(self.endpoints)} receivers")
        if self.every < 1:
            raise ValueError(f"a receiver cadence is every >= 1 versions, got {self.every}")


@dataclass
class Lane:
    """The receivers that take weights at one cadence, in a stable order (roles sorted)."""

    every: int
    endpoints: list[Any]
    devices: list[tuple[str, ...]]
    roles: dict[str, int]


@dataclass
class Topology:
    version: int
    lanes: list[Lane]

    @property
    def roles(self) -> dict[str, int]:
        return {role: n for lane in self.lanes for role, n in lane.roles.items()}


def lane_due(every: int, version: int) -> bool:
    """Whether a lane of cadence `every` takes weight version `version` (version 0 is every
    receiver's starting weights: only lane 1 is pushed it)."""
    return every == 1 or (version > 0 and version % every == 0)


class Coordinator:
    def __init__(self, cfg: Any = None, role: Any = None) -> None:
        """Deployed like every role (`cfg`, its plan part); its state is only the registrations."""
        self.receivers: dict[str, Receivers] = {}
        self.topology_version = 0
        self.published: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []

    def register(self, role: str, receivers: Receivers) -> int:
        """Replace `role`'s receivers; returns the new topology version."""
        self.receivers[role] = receivers
        self.topology_version += 1
        return self.topology_version

    def unregister(self, role: str) -> int:
        if self.receivers.pop(role, None) is not None:
            self.topology_version += 1
        return self.topology_version

    def topology(self) -> Topology:
        """Every receiver, lane by lane (cadence ascending), roles sorted within a lane."""
        lanes: dict[int, Lane] = {}
        for role in sorted(self.receivers):
            r = self.receivers[role]
            lane = lanes.setdefault(r.every, Lane(r.every, [], [], {}))
            lane.endpoints += r.endpoints
            lane.devices += r.devices
            lane.roles[role] = len(r.endpoints)
        return Topology(self.topology_version, [lanes[every] for every in sorted(lanes)])

    def publish(self, version: int, meta: dict[str, Any]) -> None:
        """Record the weights just pushed: version, tensor count, bytes, seconds."""
        self.published = {"version": version, "time": time.time(), "topology_version": self.topology_version,
                          **meta}
        self.history.append(self.published)

    def latest(self) -> dict[str, Any] | None:
        return self.published

    async def setup(self, context: Any) -> Any:
        return context

    async def shutdown(self) -> None:
        """Nothing to release: the sender and the receivers own their groups."""
