"""The Actor's side of the weight sync: from the DCS coordinator's topology to pushes over the
Actor's ranks, with retries under fault tolerance.

Before every push the coordinator's topology is read; when its version changed, rank 0 rebuilds
one weight group per lane (cadence) of receivers (`relax.distributed.checkpoint_service`): the
engines and ActorFwd's ranks take every push, the Reference every `--ref-update-interval`-th. A
push goes to the lanes due at that version. In fully-async mode a push overlaps the next step
(the plan says; the first never does). --update-weights-interval N: the engines take every N-th
version (colocate). With --use-fault-tolerance a push that a receiver failed
(an engine that died) is tried again once the coordinator lists its replacement; a replacement
engine gets the weights the ranks hold now (`restore`) before it is routed to.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from relax.backends.trainer.group import TrainerGroup
from relax.config.plan import ActorPlan
from relax.distributed.checkpoint_service.coordinator import Topology, lane_due
from relax.distributed.weights.protocol import WeightSyncError
from relax.utils.poll import Backoff

logger = logging.getLogger(__name__)


def due_lanes(lanes: list[int], version: int, engine_every: int, *, first: bool) -> list[int]:
    """The lanes (by cadence) that take `version`: each lane's own cadence, and the engines' lane
    (cadence 1; in colocate mode only the engines) only every `engine_every`-th version
    (--update-weights-interval) after the first push, which always goes (resumed weights)."""
    due = [every for every in lanes if lane_due(every, version)]
    if first or engine_every == 1 or version % engine_every == 0:
        return due
    return [every for every in due if every != 1]


class WeightPublisher:
    def __init__(self, group: TrainerGroup, plan: ActorPlan, token: str, *, retry_window_s: float | None) -> None:
        """`retry_window_s`: how long a failed push is tried again (None: not at all)."""
        self.group, self.plan, self.token, self.retry_window_s = group, plan, token, retry_window_s
        self.dcs: Any = None  # the DCS coordinator's handle (`connect`)
        self.topology_version = -1  # the topology the ranks' weight groups are built for
        self._tried_topology = -1  # the topology the last push was made for
        self.pushed = False
        self.retries = 0  # pushes tried again after a receiver failed

    def connect(self, coordinator: Any) -> None:
        self.dcs = coordinator

    async def push(self, version: int) -> dict[str, float]:
        """Push to every lane due at `version` (a no-op before `connect`: replay runs have no receivers)."""
        if self.dcs is None:
            return {}
        deadline = time.monotonic() + (self.retry_window_s or 0.0)
        while True:
            try:
                return await self._push(version)
            except WeightSyncError as exc:  # fault tolerance: retried (logged and counted), else raised
                if self.retry_window_s is None or time.monotonic() > deadline:
                    raise
                self.retries += 1
                self.topology_version = -1  # whatever the coordinator lists next, the groups are rebuilt
                cause = getattr(exc, "cause", None) or exc  # (a RayTaskError carries the rank's error as `cause`)
                logger.warning("weight push failed (%s: %s); trying again once the coordinator lists the failed "
                               "receiver's replacement", type(cause).__name__, str(cause).splitlines()[0])
                await self._topology_changed(self._tried_topology, deadline)

    async def _push(self, version: int) -> dict[str, float]:
        """One push to every receiver the coordinator lists now."""
        topology: Topology = await self.dcs.topology.remote()
        self._tried_topology = topology.version
        stats = await self._sync_topology(topology)
        if self.topology_version < 0:
            return stats
        # Overlapped pushes: the Rollout's staleness gate and evaluation wait for the engines'
        # version, not for this call. The first push never overlaps.
        lanes = due_lanes([lane.every for lane in topology.lanes], version, self.plan.engine_push_every,
                          first=not self.pushed)
        if not lanes:  # only a lane of another cadence (the Reference's), not due at this version
            return stats
        background, self.pushed = self.plan.overlap_weight_push and self.pushed, True
        stats |= await self.group.push_weights(version, background, lanes)
        if "weight_sync/version" in stats:  # the push that finished (the previous one when overlapped)
            await self.dcs.publish.remote(int(stats["weight_sync/version"]),
                                          {k.split("/")[-1]: v for k, v in stats.items() if k.count("/") == 1})
        return stats

    async def _sync_topology(self, topology: Topology) -> dict[str, float]:
        """Rebuild the lanes' weight groups when the coordinator's topology changed since the last push."""
        if topology.version == self.topology_version or not any(lane.endpoints for lane in topology.lanes):
            return {}
        for lane in topology.lanes:
            how = await self.group.connect_receivers(lane.endpoints, self.token, self.plan.pause_mode, lane.devices,
                                                     lane.every)
            logger.info("weight group (every %d version(s)) rebuilt for topology v%d over %s: %s", lane.every,
                        topology.version, how, lane.roles)
        self.topology_version = topology.version
        return {"weight_sync/topology_version": float(topology.version)}

    async def _topology_changed(self, old: int, deadline: float) -> None:
        """Wait (until `deadline`) for a coordinator topology other than version `old`."""
        backoff = Backoff()
        while (await self.dcs.topology.remote()).version == old and time.monotonic() < deadline:
            await backoff.wait()

    async def restore(self, receivers: list[Any], devices: list[Any] | None, version: int) -> dict[str, float]:
        """Tier 1: the weights the ranks hold now (`version`) to `receivers` only (replacement
        engines, before they are routed to); the next regular push rebuilds every lane."""
        self.topology_version = -1
        try:
            return await self._push_to(receivers, devices, version)
        except WeightSyncError as exc:  # once more: the error may be an earlier background push's
            logger.warning("restoring weights on %s failed (%s); trying once more", receivers, exc)
        return await self._push_to(receivers, devices, version)

    async def _push_to(self, receivers: list[Any], devices: list[Any] | None, version: int) -> dict[str, float]:
        await self.group.connect_receivers(receivers, self.token, self.plan.pause_mode, devices)
        return await self.group.push_weights(version, False, [1])
