"""GenRM role: the judge model's inference engines behind one router (LLM-as-judge rewards).

Deployed when `--genrm-model-path` is set (first in the plan: the Rollout's rewards need it).
It launches `--genrm-num-gpus / --genrm-num-gpus-per-engine` engines of the run's inference
backend (`--rollout-backend`; on CPU each is one engine process) from `--genrm-model-path`,
with `--genrm-engine-config` as engine options, behind a router (an `EngineFleet`). `setup()`
publishes the router URL; the Rollout hands it to the `genrm` reward type
(`relax.engine.rewards.genrm`), which builds the judge prompts and parses the verdicts. The
judge's weights never change during the run (no weight sync). With `--use-fault-tolerance` the
HealthManager (`relax.core.health`) watches the judges: a dead or hung one is replaced by a fresh
engine from the same checkpoint, and its requests in flight are sent again (`check_engines`,
`replace_engine`, `admit_engine`, as the Rollout's engines).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any

from relax.components.setup_context import SetupContext
from relax.config.fault import recovery_window_s
from relax.config.plan import RolePlan
from relax.config.schema import RelaxConfig
from relax.engine.fleet import EngineFleet, FleetSpec
from relax.utils.http_utils import close_sessions
from relax.utils.logging import run_token, setup_logging

logger = logging.getLogger(__name__)


class GenRM:
    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        setup_logging()
        self.cfg, self.plan = cfg, plan
        self.token = run_token()
        self.fleet: EngineFleet | None = None
        self.gpu_slots: Any = None

    async def start(self) -> None:
        """Launch the judge engines behind their router."""
        cfg, n = self.cfg, self.plan.workers
        from relax.distributed.ray.placement import engine_gpus

        self.gpu_slots = await asyncio.to_thread(engine_gpus, self.plan)  # GPU clusters: the judges' GPUs
        self.fleet = EngineFleet(FleetSpec(
            name="genrm", backend=cfg.cluster.rollout_backend, model_path=cfg.reward.genrm_model_path,
            api_key=self.token, log_dir=cfg.misc.exp_dir or ".",
            threads=cfg.cluster.engine_threads or max(1, (os.cpu_count() or 1) // n),
            options=cfg.reward.genrm_engine_config, startup_timeout=cfg.rollout.engine_startup_timeout,
            http_timeout=cfg.rollout.http_timeout, devices=tuple(self.gpu_slots.devices) if self.gpu_slots else (),
            hold_s=recovery_window_s(cfg) if cfg.fault.use_fault_tolerance else 0.0))
        try:
            await self.fleet.start(n)
        except ValueError as exc:  # a bad engine option: name the flag
            raise ValueError(f"--genrm-engine-config: {exc}") from exc

    async def setup(self, ctx: SetupContext) -> SetupContext:
        """Publishes the router URL for the Rollout's rewards."""
        return dataclasses.replace(ctx, genrm_url=self.fleet.router_url)

    def engine_urls(self) -> list[str]:
        return self.fleet.urls if self.fleet else []

    async def stats(self) -> dict[str, float]:
        """Judge requests served so far, requests in flight, and live engines."""
        router = self.fleet.router if self.fleet else None
        return {"genrm/requests": float(router.served if router else 0),
                "genrm/in_flight": float(sum(router.in_flight.values()) if router else 0),
                "genrm/engines_alive": float(self.fleet.alive() if self.fleet else 0)}

    # ---- health (relax.core.health drives these) ------------------------------------------
    async def check_engines(self, timeout: float) -> list[tuple[str, str]]:
        """(url, what is wrong) for every judge engine that died or did not answer its health check."""
        return await self.fleet.probe(timeout) if self.fleet else []

    async def replace_engine(self, url: str) -> str:
        """A fresh judge from the same checkpoint in place of the failed one at `url` (its requests in
        flight wait for it or go to the others); returns its URL, not yet routed to (`admit_engine`)."""
        return await self.fleet.replace(url)

    async def admit_engine(self, url: str) -> None:
        await self.fleet.admit(url)

    def requests_resent(self) -> int:
        """Judge requests sent again after their engine failed, so far."""
        return self.fleet.requests_resent() if self.fleet else 0

    async def shutdown(self) -> None:
        if self.fleet is not None:
            await self.fleet.stop()
            self.fleet = None
        if self.gpu_slots is not None:
            self.gpu_slots.release()
        await close_sessions()
