"""Elastic rollout scaling in a run: the scaling REST API and the autoscaler beside the Controller's loop.

The scaler (`relax.engine.elastic.scaler`) works on the Rollout's engine fleet through `RoleFleetOps`:
fleet operations go to the Rollout (`Rollout.fleet_call`), and weights come as the HealthManager's do
for a replacement engine: the DCS coordinator lists the new topology, then the Actor pushes the weights
its ranks hold now to the new engines alone (`restore_weights`), and the Rollout checks they hold that
version before they join the router. A drained engine leaves the coordinator's topology at once, so no
weight push waits on it. The API is served here, in the driver, on the Controller's event loop (loopback
unless --scale-api-host says otherwise); its address and token go to the run directory for
`relax-scale`. With --autoscaler-config the autoscaler decides every `interval_s` from the run's signals
(the trainer's wait for samples, the engines' queue depth and utilization, samples/s, staleness headroom).
Every operation event and decision is appended to `<exp-dir>/elastic_events.jsonl`, counted in the step
metrics (`elastic/*`) and drawn on the timeline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from typing import Any

from relax.config.autoscaler import load_autoscaler_config
from relax.config.elastic import serves_scaling_api
from relax.config.plan import RunPlan
from relax.config.schema import RelaxConfig
from relax.engine.elastic import discovery
from relax.engine.elastic.api import ScalingApi
from relax.engine.elastic.autoscaler import Autoscaler, Signals, step_signals
from relax.engine.elastic.calls import Abandon, Capacity, Engines, Launch, Load, OnEngine, Register, Release, Verify
from relax.engine.elastic.local_ops import LocalFleetOps
from relax.engine.elastic.operations import Operation
from relax.engine.elastic.scaler import FleetScaler, ScalerSettings
from relax.utils.timeline import Timeline

logger = logging.getLogger(__name__)
EVENTS_FILE = "elastic_events.jsonl"
STOP_WAIT_S = 60.0  # at the run's end, how long a scaling operation in flight may take to roll back or end


class RoleFleetOps:
    """`FleetOps` over the run's roles (module doc)."""

    def __init__(self, roles: dict[str, Any]) -> None:
        self.rollout, self.actor, self.dcs = roles["rollout"], roles["actor"], roles["dcs"]

    async def engines(self) -> list[dict[str, Any]]:
        return await self.rollout.fleet_call(Engines())

    async def capacity(self) -> int | None:
        return await self.rollout.fleet_call(Capacity())

    async def launch(self, count: int, timeout: float, tag: str) -> list[dict[str, str]]:
        return await self.rollout.fleet_call(Launch(count, timeout, tag))

    async def register(self, address: str, timeout: float, tag: str) -> dict[str, str]:
        return await self.rollout.fleet_call(Register(address, timeout, tag))

    async def sync(self, urls: list[str]) -> int | None:
        """The new engines join the coordinator's topology, get the Actor's weights, and are checked."""
        receivers = await self._register()
        devices = [receivers.devices[receivers.endpoints.index(u)] for u in urls]
        stats = await self.actor.restore_weights(urls, devices)
        version = stats.get("weight_sync/version")
        return await self.rollout.fleet_call(Verify(tuple(urls), None if version is None else int(version)))

    async def admit(self, url: str) -> None:
        await self.rollout.fleet_call(OnEngine(LocalFleetOps.admit, url))

    async def abandon(self, tag: str) -> list[str]:
        gone = await self.rollout.fleet_call(Abandon(tag))
        await self._register()
        return gone

    async def drain(self, url: str) -> None:
        await self.rollout.fleet_call(OnEngine(LocalFleetOps.drain, url))
        await self._register()  # out of the topology: no push waits on it

    async def undrain(self, url: str) -> None:
        await self.rollout.fleet_call(OnEngine(LocalFleetOps.undrain, url))
        await self._register()

    async def in_flight(self, url: str) -> int:
        return await self.rollout.fleet_call(OnEngine(LocalFleetOps.in_flight, url))

    async def evict(self, url: str) -> int:
        return await self.rollout.fleet_call(OnEngine(LocalFleetOps.evict, url))

    async def release(self, url: str, timeout: float) -> None:
        await self.actor.settle_weights()  # no push that still includes it is in flight when it stops
        await self.rollout.fleet_call(Release(url, timeout))

    async def _register(self) -> Any:
        receivers = await self.rollout.weight_receivers()
        await self.dcs.register("rollout", receivers)
        return receivers


class ElasticService:
    """The run's scaling API and autoscaler (module doc); does nothing when the plan serves no API."""

    def __init__(self, cfg: RelaxConfig, plan: RunPlan, roles: dict[str, Any], timeline: Timeline,
                 fleet_lock: asyncio.Lock | None = None) -> None:
        """`fleet_lock`: held by each scaling operation and by the HealthManager's engine replacements."""
        self.cfg, self.roles, self.timeline, self.fleet_lock = cfg, roles, timeline, fleet_lock
        self.enabled = serves_scaling_api(cfg) and "rollout" in roles and "rollout" in plan.weight_receivers
        self.exp_dir = cfg.misc.exp_dir or "."
        self.max_staleness = float(plan.actor.max_staleness) if plan.mode == "fully_async" else None
        self.scaler: FleetScaler | None = None
        self.api: ScalingApi | None = None
        self.autoscaler: Autoscaler | None = None
        self._task: asyncio.Task | None = None
        self._last: dict[str, float] = {}  # the last step's signals (trainer wait, samples/s, headroom)
        self._busy: tuple[float, dict[str, dict[str, float]]] | None = None  # (time, load) at the last read
        self._decided = Counter()  # autoscaler decisions counted into step metrics so far

    async def start(self) -> None:
        if not self.enabled:
            return
        e = self.cfg.elastic
        self.scaler = FleetScaler(RoleFleetOps(self.roles), ScalerSettings.from_config(e), sink=self._event,
                                  lock=self.fleet_lock)
        if e.autoscaler_config:
            self.autoscaler = Autoscaler(load_autoscaler_config(e.autoscaler_config), self.scaler, self.signals,
                                         sink=self._event)
        token = discovery.new_token(self.exp_dir)
        self.api = ScalingApi(self.scaler, token, e.scale_api_host, e.scale_api_port,
                              extra=self.autoscaler.status if self.autoscaler else None)
        await self.api.start()
        discovery.publish(self.exp_dir, self.api.url)
        if self.autoscaler is not None:
            self._task = asyncio.ensure_future(self.autoscaler.run())
        print(f"scaling API: {self.api.url} (relax-scale --exp-dir {self.exp_dir} status)", flush=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        running = self.scaler.book.running if self.scaler else None
        if running is not None and running.task is not None:  # rolled back if it can be, else finished
            if running.cancellable:
                running.task.cancel()
            await asyncio.wait([running.task], timeout=STOP_WAIT_S)
        if self.api is not None:
            await self.api.stop()
            discovery.unpublish(self.exp_dir)

    # ---- signals and metrics ---------------------------------------------------------------
    def observe(self, step: int, metrics: dict[str, float]) -> None:
        """The step's signals for the autoscaler, from its metrics row."""
        self._last |= step_signals(step, metrics, self.max_staleness)

    async def signals(self) -> Signals:
        table = await self.scaler.ops.engines()
        active = [e for e in table if e["state"] == "active"]
        load = await self.roles["rollout"].fleet_call(Load())
        now, utilization = time.monotonic(), None
        if self._busy is not None and load and now > self._busy[0]:
            before = self._busy[1]
            spent = [v["busy_seconds"] - before.get(u, {}).get("busy_seconds", v["busy_seconds"]) for u, v in
                     load.items()]
            utilization = min(1.0, max(0.0, sum(spent) / len(spent) / (now - self._busy[0])))
        self._busy = (now, load)
        depth = sum(v["in_flight"] for v in load.values()) / len(load) if load else None
        return Signals(engines=len(active), removable=sum(not e["protected"] for e in active),
                       busy=self.scaler.book.running is not None, queue_depth=depth, utilization=utilization,
                       **self._last)

    async def step_metrics(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """`elastic/*` of the step: engines now, operations finished since the last step (count, seconds,
        engines added and removed, requests drained and re-sent), autoscaler decisions."""
        if self.scaler is None:
            return {}
        self.observe(step, metrics)
        done = self.scaler.take_finished()
        for op in done:
            draw(self.timeline, op)
        table = await self.scaler.ops.engines()
        out = {"elastic/engines": float(sum(e["state"] == "active" for e in table)),
               "elastic/operations": float(len(done)),
               "elastic/operations_failed": float(sum(op.status in ("failed", "cancelled") for op in done)),
               "elastic/operation_seconds": sum(op.duration_s for op in done),
               "elastic/engines_added": float(sum(len(op.added) for op in done)),
               "elastic/engines_removed": float(sum(len(op.removed) for op in done)),
               "elastic/requests_drained": float(sum(op.requests_drained for op in done)),
               "elastic/requests_resent": float(sum(op.requests_resent for op in done))}
        if self.autoscaler is not None:
            counts, self._decided = self.autoscaler.counts - self._decided, Counter(self.autoscaler.counts)
            out |= {f"elastic/autoscaler_{action}": float(counts[action]) for action in ("scale_out", "scale_in",
                                                                                          "hold")}
        return out

    def _event(self, record: dict[str, Any]) -> None:
        path = os.path.join(self.exp_dir, EVENTS_FILE)
        with open(path, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")


def draw(timeline: Timeline, op: Operation) -> None:
    """A finished scaling operation on the timeline (`--timeline-dump-dir`), and each engine that joined or
    left with it (a 1 ms mark at the operation's end)."""
    end = op.finished or time.time()
    timeline.record(f"{op.kind} ({op.status})", op.created, end, op=op.id)
    for verb, urls in (("joins", op.added), ("leaves", op.removed)):
        for url in urls:
            timeline.record(f"engine {verb}: {url}", end - 0.001, end, op=op.id)
