"""A run's elastic scaling: the scaling REST API, the `FleetScaler` and the autoscaler, hosted by the Rollout.

The Rollout role owns the engine fleet, so the scaling service runs in its process, on its replica's
event loop (no process of its own): the scaler works on the fleet directly and reaches the Actor and
the DCS coordinator only for weights (`run_ops.RunFleetOps`). The Controller starts it once the
engines hold the Actor's weights (`Rollout.start_scaling`), takes its step metrics
(`Rollout.scaling_metrics`) and stops it before the roles go (`Rollout.stop_scaling`; the Rollout's
shutdown stops it too). Every operation holds the fleet's lock (`fleet_lock.FleetLock`), which the
HealthManager's engine replacements hold as well.

The API binds loopback unless --scale-api-host says otherwise (on several nodes it listens on the
Rollout replica's node); its address and token go to the run directory for `relax-scale`. With
--autoscaler-config the autoscaler decides every `interval_s` from the run's signals (the trainer's
wait for samples and the staleness headroom, from the metrics row the Controller passes each step;
the engines' queue depth and utilization, measured here). Every operation event and decision is
appended to `<exp-dir>/elastic_events.jsonl`, counted in the step metrics (`elastic/*`) and drawn on
the timeline's `scaling` track (--timeline-dump-dir).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from typing import Any

from relax.config.autoscaler import load_autoscaler_config
from relax.config.schema import RelaxConfig
from relax.engine.elastic import discovery
from relax.engine.elastic.api import ScalingApi
from relax.engine.elastic.autoscaler import Autoscaler, Signals, step_signals
from relax.engine.elastic.operations import Operation
from relax.engine.elastic.run_ops import RunFleetOps
from relax.engine.elastic.scaler import FleetScaler, ScalerSettings
from relax.utils.timeline import Timeline

EVENTS_FILE = "elastic_events.jsonl"
STOP_WAIT_S = 60.0  # at the run's end, how long a scaling operation in flight may take to roll back or end


class NoScaling:
    """A Rollout that serves no scaling API (before `start_scaling`, or the run serves none)."""

    async def stop(self) -> None:
        """Nothing runs."""

    async def step_metrics(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        return {}


class ScalingService:
    def __init__(self, cfg: RelaxConfig, ops: RunFleetOps, lock: asyncio.Lock, max_staleness: float | None) -> None:
        """`lock`: the fleet's (`FleetLock.lock`), held by each operation; `max_staleness`: fully async, the
        staleness bound (the autoscaler's headroom signal), else None."""
        e = cfg.elastic
        self.cfg, self.ops, self.max_staleness = cfg, ops, max_staleness
        self.exp_dir = cfg.misc.exp_dir or "."
        self.timeline = Timeline(cfg.logging.timeline_dump_dir, "scaling")
        self.scaler = FleetScaler(ops, ScalerSettings.from_config(e), sink=self._event, lock=lock)
        self.autoscaler = Autoscaler(load_autoscaler_config(e.autoscaler_config), self.scaler, self.signals,
                                     sink=self._event) if e.autoscaler_config else None
        self.api: ScalingApi | None = None
        self._task: asyncio.Task | None = None  # the autoscaler's loop
        self._last: dict[str, float] = {}  # the last step's signals (trainer wait, samples/s, headroom)
        self._busy: tuple[float, dict[str, dict[str, float]]] | None = None  # (time, load) at the last read
        self._decided: Counter[str] = Counter()  # autoscaler decisions counted into step metrics so far

    async def start(self) -> str:
        """Serve the API (and start the autoscaler); its base URL."""
        e = self.cfg.elastic
        token = discovery.new_token(self.exp_dir)
        self.api = ScalingApi(self.scaler, token, e.scale_api_host, e.scale_api_port,
                              extra=self.autoscaler.status if self.autoscaler else None)
        await self.api.start()
        discovery.publish(self.exp_dir, self.api.url)
        if self.autoscaler is not None:
            self._task = asyncio.ensure_future(self.autoscaler.run())
        return self.api.url

    async def stop(self) -> None:
        """No more operations: the autoscaler stops, the operation in flight is rolled back if it can be
        (else finished, within STOP_WAIT_S), the API stops and leaves the run directory. Idempotent."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        running = self.scaler.book.running
        if running is not None and running.task is not None:
            if running.cancellable:
                running.task.cancel()
            await asyncio.wait([running.task], timeout=STOP_WAIT_S)
        if self.api is not None:
            await self.api.stop()
            discovery.unpublish(self.exp_dir)
            self.api = None

    # ---- signals and metrics ---------------------------------------------------------------
    async def signals(self) -> Signals:
        """The autoscaler's signals now: the engines and their load, with the last step's (`step_metrics`)."""
        table = await self.ops.engines()
        active = [e for e in table if e["state"] == "active"]
        load = await self.ops.load()
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
        """`elastic/*` of the step whose metrics row is `metrics` (its signals go to the autoscaler): engines
        now, operations finished since the last step (count, seconds, engines added and removed, requests
        drained and re-sent), autoscaler decisions. The finished operations are drawn on the timeline."""
        self._last |= step_signals(step, metrics, self.max_staleness)
        done = self.scaler.take_finished()
        for op in done:
            draw(self.timeline, op)
        table = await self.ops.engines()
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
        with open(os.path.join(self.exp_dir, EVENTS_FILE), "a") as f:
            f.write(json.dumps(record, default=str) + "\n")


def draw(timeline: Timeline, op: Operation) -> None:
    """A finished scaling operation on the timeline (`--timeline-dump-dir`), and each engine that joined or
    left with it (a 1 ms mark at the operation's end)."""
    end = op.finished or time.time()
    timeline.record(f"{op.kind} ({op.status})", op.created, end, op=op.id)
    for verb, urls in (("joins", op.added), ("leaves", op.removed)):
        for url in urls:
            timeline.record(f"engine {verb}: {url}", end - 0.001, end, op=op.id)
