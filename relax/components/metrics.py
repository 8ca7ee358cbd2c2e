"""Metrics role (`--use-metrics-service`): one Serve deployment every role reports to.

A role sends `report(step, role, metrics)` whenever it has numbers for a step (the streaming
roles of a fully-async run do, through `relax.utils.metrics.MetricsReporter`); the Controller
closes the step with `log(step, "controller", metrics)`, the step's merged metrics. Closing a
step merges what the roles reported for it (and any earlier open step) into one row and hands
it to the sinks (`relax.utils.metrics_sinks`: JSONL log, TensorBoard, W&B, ClearML), each
behind its own queue and thread, so a slow or failing sink never holds up a caller. A report
that arrives after its step was closed is written as a row of its own for that step.

Without the flag the Controller fans out in its own process through the same sinks
(`relax.core.metrics`); `sink_config` turns the flags into the sinks' config in both cases.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from typing import Any

from relax.components.setup_context import SetupContext
from relax.config.plan import RolePlan
from relax.config.schema import RelaxConfig
from relax.utils.logging import setup_logging
from relax.utils.metrics_sinks import MetricsFanout, SinkConfig, enabled_sinks, loggable

logger = logging.getLogger(__name__)

# Flags never sent to W&B / ClearML as the run's config (Apprise URLs carry service tokens).
SECRET_FLAG = re.compile(r"api_key|secret|password|passwd|notify_urls|(^|_)token$")


def run_flags(cfg: RelaxConfig) -> dict[str, Any]:
    """The run's flags as W&B config / ClearML hyperparameters (plain values, secrets left out)."""
    plain = (str, int, float, bool, type(None), list, tuple, dict)
    return {k: v if isinstance(v, plain) else str(v) for k, v in sorted(vars(cfg.args).items())
            if not SECRET_FLAG.search(k)}


def sink_config(cfg: RelaxConfig) -> SinkConfig:
    """The sinks' view of the flags. TensorBoard: `--tb-project-name` is the directory (default
    $TENSORBOARD_DIR, else <exp-dir>/tb) and `--tb-experiment-name` the run below it. W&B and
    ClearML: the project is the last part of `--tb-project-name` and the run/task name
    `--tb-experiment-name` (default: the run directory's name), as verl's
    `trainer.project_name` / `trainer.experiment_name`."""
    log, exp_dir = cfg.logging, cfg.misc.exp_dir
    tb_root = log.tb_project_name or os.environ.get("TENSORBOARD_DIR") or os.path.join(exp_dir, "tb")
    project = os.path.basename(os.path.normpath(log.tb_project_name)) if log.tb_project_name else None
    return SinkConfig(exp_dir=exp_dir, tb_dir=os.path.join(tb_root, log.tb_experiment_name or ""), project=project,
                      run_name=log.tb_experiment_name, run_config=run_flags(cfg))


def open_fanout(cfg: RelaxConfig) -> MetricsFanout:
    """Every sink the flags turn on, started (each in its own thread)."""
    return MetricsFanout(sink_config(cfg), enabled_sinks(cfg.logging))


class MetricsService:
    """Collects the roles' reports per step and writes each closed step to every sink."""

    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        setup_logging()
        self.fanout = open_fanout(cfg)
        self.open: dict[int, dict[str, float]] = {}  # step -> what roles reported for it so far
        self.closed = -1  # the last step the Controller closed

    async def setup(self, ctx: SetupContext) -> SetupContext:
        return ctx

    async def report(self, step: int, role: str, metrics: dict[str, Any]) -> None:
        """`role`'s metrics for `step`; written when the step is closed (at once if it already was)."""
        values = loggable(metrics)
        if step <= self.closed:
            logger.debug("late report from %s for closed step %d: written as its own row", role, step)
            self.fanout.log(step, values)
            return
        self.open.setdefault(step, {}).update(values)

    async def log(self, step: int, role: str, metrics: dict[str, Any]) -> None:
        """Close `step`: its row (roles' reports, then `metrics`) and every earlier open step go out."""
        self.open.setdefault(step, {}).update(loggable(metrics))
        for done in sorted(s for s in self.open if s <= step):
            self.fanout.log(done, self.open.pop(done))
        self.closed = max(self.closed, step)

    async def shutdown(self) -> None:
        """Write the steps still open, then close every sink (each within the deadline)."""
        for step in sorted(self.open):
            self.fanout.log(step, self.open.pop(step))
        await asyncio.to_thread(self.fanout.close)
