"""The DCS coordinator: registration, topology and weight metadata (a Serve app, one replica).

State is small and in memory: `receivers[role] -> endpoints`, a topology version bumped on
every change (senders compare it to the one their group was built for), and the metadata of
the last published weights. Nothing here moves tensors; the sender and the receivers do.
"""

from __future__ import annotations

import time
from typing import Any


class Coordinator:
    def __init__(self, cfg: Any = None, role: Any = None) -> None:
        """Deployed like every role (`cfg`, its plan part); its state is only the registrations."""
        self.receivers: dict[str, list[Any]] = {}
        self.devices: dict[str, list[Any]] = {}  # per receiver, the GPUs it holds weights on
        self.topology_version = 0
        self.published: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []

    def register(self, role: str, endpoints: list[Any], devices: list[Any] | None = None) -> int:
        """Replace `role`'s receivers; returns the new topology version. `devices`: per endpoint,
        the GPUs it holds weights on (the sender uses CUDA IPC for those on its own GPU)."""
        self.receivers[role] = list(endpoints)
        self.devices[role] = list(devices) if devices is not None else [()] * len(endpoints)
        if len(self.devices[role]) != len(endpoints):
            raise ValueError(f"{role}: {len(self.devices[role])} device lists for {len(endpoints)} receivers")
        self.topology_version += 1
        return self.topology_version

    def unregister(self, role: str) -> int:
        self.devices.pop(role, None)
        if self.receivers.pop(role, None) is not None:
            self.topology_version += 1
        return self.topology_version

    def topology(self) -> dict[str, Any]:
        """Every receiver, in a stable order (roles sorted), with the topology version."""
        roles = sorted(self.receivers)
        return {"version": self.topology_version, "endpoints": [e for r in roles for e in self.receivers[r]],
                "devices": [d for r in roles for d in self.devices[r]],
                "roles": {r: len(self.receivers[r]) for r in roles}}

    def publish(self, version: int, meta: dict[str, Any]) -> None:
        """Record the weights just pushed: version, tensor count, bytes, seconds."""
        self.published = {"version": version, "time": time.time(), "topology_version": self.topology_version,
                          **meta}
        self.history.append(self.published)

    def latest(self) -> dict[str, Any] | None:
        return self.published

    async def setup(self, context: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def shutdown(self) -> None:
        """Nothing to release: the sender and the receivers own their groups."""
