"""Where the Controller sends each step's metrics: the metrics role, or its own fan-out.

With `--use-metrics-service` the step's row goes to the metrics role
(`relax.components.metrics.MetricsService`), which merges what the other roles reported for
the step and writes every sink. Without it the driver writes the same sinks itself, each in a
thread of its own (`relax.utils.metrics_sinks`), as slime and verl log from the driver:
`--use-wandb` / `--use-clearml` / `--use-tensorboard` work either way. Neither path can stop
training: sinks never block, and a metrics role that stops answering is logged once and skipped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from relax.components.metrics import open_fanout
from relax.config.schema import RelaxConfig

logger = logging.getLogger(__name__)

SERVICE_TIMEOUT_S = 30.0  # a report to the metrics role; its sinks never make it wait


class DriverMetrics:
    """The sinks, fanned out in the driver's process."""

    def __init__(self, cfg: RelaxConfig) -> None:
        self.fanout = open_fanout(cfg)

    async def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.fanout.log(step, metrics)

    async def close(self) -> None:
        await asyncio.to_thread(self.fanout.close)


class ServiceMetrics:
    """The step's row to the metrics role (`role`: its handle, `await role.log(...)`)."""

    def __init__(self, role: Any) -> None:
        self.role = role
        self.failed = False

    async def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.failed:
            return
        try:
            await asyncio.wait_for(asyncio.ensure_future(self.role.log(step, "controller", metrics)),
                                   SERVICE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - metrics must never stop training
            self.failed = True
            logger.error("the metrics service did not take step %d's metrics (%s: %s); no more metrics are sent "
                         "to it for the rest of the run (the run goes on)", step, type(exc).__name__, exc)

    async def close(self) -> None:
        """Nothing here: the metrics role closes its sinks when the roles shut down."""


def step_metrics(cfg: RelaxConfig, roles: dict[str, Any]) -> DriverMetrics | ServiceMetrics:
    """The metrics role's client when the run deploys one, else the driver's own fan-out."""
    return ServiceMetrics(roles["metrics"]) if "metrics" in roles else DriverMetrics(cfg)
