"""The autoscaler (`--autoscaler-config`): every `interval_s` it reads the run's signals, decides with a pure
rule (`decide`) and acts through the scaler, under the API's own rules (one operation at a time,
protected engines, the cluster's room). Every decision, holds included, is an event with its reason.

The rule, in order (thresholds from `relax.config.autoscaler.AutoscalerConfig`):
1. out of bounds: below `min_engines` grow to it, above `max_engines` shrink to it;
2. an operation runs, or the last change ended less than `cooldown_s` ago: hold;
3. the target metric unknown yet (no step measured): hold;
4. metric > `scale_out_threshold` and below `max_engines`: add `step_size` (capped by the bound);
5. metric < `scale_in_threshold`, above `min_engines`, an unprotected engine to remove, and the
   engines' utilization at most `idle_utilization` (the others absorb the load: throughput is kept):
   remove `step_size` (capped by the bound and the removable engines);
6. else hold.
Every metric grows with the demand for rollout (`relax.config.autoscaler.TARGET_METRICS`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from relax.config.autoscaler import AutoscalerConfig
from relax.engine.elastic.operations import Operation, ScalingError
from relax.engine.elastic.scaler import FleetScaler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Signals:
    """What the run measured since the last decision (None: not measured yet)."""

    engines: int  # active engines (taking requests)
    removable: int  # active engines that are not protected
    busy: bool = False  # a scaling operation runs
    trainer_wait: float | None = None
    queue_depth: float | None = None
    utilization: float | None = None
    samples_per_second: float | None = None
    staleness_headroom: float | None = None


@dataclass(frozen=True)
class Decision:
    action: str  # scale_out / scale_in / hold
    count: int
    reason: str


def step_signals(step: int, metrics: dict[str, float], max_staleness: float | None) -> dict[str, float]:
    """The signals one training step's metrics row gives: the trainer's wait for samples as a share of
    the step (`time/trainer_wait` in fully async, the rollout phase in colocate), samples/s, and in fully
    async (`max_staleness` not None) the staleness headroom: the bound minus how far ahead of the trained
    version the step's rollout started."""
    out: dict[str, float] = {}
    total = metrics.get("time/step") or 0.0
    waited = metrics.get("time/trainer_wait", metrics.get("time/rollout"))
    if total > 0 and waited is not None:
        out["trainer_wait"] = min(1.0, waited / total)
        out["samples_per_second"] = metrics.get("rollout/num_samples", 0.0) / total
    if max_staleness is not None and "rollout/started_at_version" in metrics:
        out["staleness_headroom"] = max_staleness - (step - metrics["rollout/started_at_version"])
    return out


def decide(cfg: AutoscalerConfig, s: Signals, now: float, last_change: float | None) -> Decision:
    """The autoscaler's rule (module doc): a pure function of the config, the signals and the clock."""
    if s.engines < cfg.min_engines and not s.busy:
        return Decision("scale_out", cfg.min_engines - s.engines, f"{s.engines} engine(s) < min_engines "
                        f"{cfg.min_engines}")
    if s.engines > cfg.max_engines and not s.busy and s.removable:
        return Decision("scale_in", min(s.engines - cfg.max_engines, s.removable),
                        f"{s.engines} engine(s) > max_engines {cfg.max_engines}")
    if s.busy:
        return Decision("hold", 0, "a scaling operation is running")
    if last_change is not None and now - last_change < cfg.cooldown_s:
        return Decision("hold", 0, f"cooldown: {cfg.cooldown_s - (now - last_change):.0f}s left of {cfg.cooldown_s:g}s")
    value = getattr(s, cfg.target_metric)
    if value is None:
        return Decision("hold", 0, f"{cfg.target_metric} not measured yet")
    what = f"{cfg.target_metric} {value:.3g}"
    if value > cfg.scale_out_threshold:
        if s.engines >= cfg.max_engines:
            return Decision("hold", 0, f"{what} > {cfg.scale_out_threshold:g}, but already max_engines "
                            f"{cfg.max_engines}")
        return Decision("scale_out", min(cfg.step_size, cfg.max_engines - s.engines),
                        f"{what} > scale_out_threshold {cfg.scale_out_threshold:g}")
    if value < cfg.scale_in_threshold:
        if s.engines <= cfg.min_engines or not s.removable:
            why = f"min_engines {cfg.min_engines}" if s.engines <= cfg.min_engines else "only protected engines"
            return Decision("hold", 0, f"{what} < {cfg.scale_in_threshold:g}, but {why}")
        if s.utilization is not None and s.utilization > cfg.idle_utilization:
            return Decision("hold", 0, f"{what} < {cfg.scale_in_threshold:g}, but the engines are busy (utilization "
                            f"{s.utilization:.2f} > idle_utilization {cfg.idle_utilization:g})")
        return Decision("scale_in", min(cfg.step_size, s.engines - cfg.min_engines, s.removable),
                        f"{what} < scale_in_threshold {cfg.scale_in_threshold:g}")
    return Decision("hold", 0, f"{what} within [{cfg.scale_in_threshold:g}, {cfg.scale_out_threshold:g}]")


class Autoscaler:
    def __init__(self, cfg: AutoscalerConfig, scaler: FleetScaler, signals: Callable[[], Awaitable[Signals]],
                 sink: Callable[[dict[str, Any]], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        """`signals()`: the run's measurements now; `sink(event)`: where each decision goes (the run's log)."""
        self.cfg, self.scaler, self.signals, self.sink, self.clock = cfg, scaler, signals, sink, clock
        self.decisions: list[dict[str, Any]] = []  # every decision (the newest kept)
        self.counts: Counter[str] = Counter()  # decisions by action, cumulative
        self._mine: Operation | None = None  # the last operation this autoscaler started
        self._last_change: float | None = None
        self._serial = 0

    async def step(self) -> Decision:
        """One decision, acted on; returns it."""
        signals = await self.signals()
        decision = decide(self.cfg, signals, self.clock(), self._last_change)
        operation = None
        if decision.action != "hold":
            operation, decision = await self._act(decision)
        self._record(decision, signals, operation)
        return decision

    async def _act(self, decision: Decision) -> tuple[str | None, Decision]:
        self._serial += 1
        key = f"autoscaler-{int(self.clock())}-{self._serial}"
        start = self.scaler.scale_out if decision.action == "scale_out" else self.scaler.scale_in
        try:
            op, _ = await start({"num_engines": decision.count}, key)
        except ScalingError as exc:  # the API's rules refused it (another operation, no room): say so
            return None, dataclasses.replace(decision, action="hold",
                                             reason=f"{decision.reason}; {decision.action} refused: {exc.message}")
        self._mine, self._last_change = op, self.clock()
        if op.task is not None:  # the cooldown runs from the change's end
            op.task.add_done_callback(lambda _: setattr(self, "_last_change", self.clock()))
        return op.id, decision

    def _record(self, decision: Decision, signals: Signals, operation: str | None) -> None:
        self.counts[decision.action] += 1
        event = {"time": self.clock(), "kind": "autoscaler", "action": decision.action, "count": decision.count,
                 "reason": decision.reason, "operation": operation, "signals": dataclasses.asdict(signals)}
        self.decisions = (self.decisions + [event])[-100:]
        if decision.action != "hold":
            logger.info("autoscaler: %s %d (%s) -> %s", decision.action, decision.count, decision.reason, operation)
        if self.sink is not None:
            self.sink(event)

    async def run(self) -> None:
        """Decide every `interval_s` until cancelled; a failed signal read is logged and skipped."""
        while True:
            await asyncio.sleep(self.cfg.interval_s)
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - one missed decision must not stop the run
                logger.warning("autoscaler: no decision this round (%s: %s)", type(exc).__name__, exc)

    def status(self) -> dict[str, Any]:
        """For GET /fleet."""
        return {"autoscaler": {"config": dataclasses.asdict(self.cfg), "last_decisions": self.decisions[-5:]}}
