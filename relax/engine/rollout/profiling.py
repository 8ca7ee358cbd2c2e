"""Engine profiling per rollout step (`--sglang-profile*`): which steps, and SGLang's profiler API.

At the start of a selected step the Rollout posts `/start_profile` to every engine with SGLang's
`ProfileReq` fields (`relax.config.engine_profile.profile_request`, plus `output_dir` =
`<trace dir>/rollout_<step>` and `profile_prefix` = `engine<i>`, so each engine's trace file is
named apart); at its end it posts `/stop_profile`, unless `num_steps` is set: the engine then stops
on its own after that many forward steps (SGLang's rule; a stop it did not expect is an error).
Both backends answer the two endpoints: SGLang with its own profiler, the hf engine with
torch.profiler (`relax.backends.hf.profiler`).

Step selection follows the seeds: `--sglang-profile-steps` (a list) wins; else the inclusive range
`--sglang-profile-step-start`..`--sglang-profile-step-end` (either end open); else every step.
Profiling is a diagnostic: an engine that refuses or fails a request is logged and counted
(`profile/engine_errors`), and the step goes on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from relax.config.engine_profile import profile_request
from relax.config.schema import RelaxConfig
from relax.distributed.engine_client import EngineClient, EngineError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileSpec:
    """Which rollout steps are profiled and what every /start_profile asks for."""

    output_dir: str
    steps: frozenset[int] | None = None
    step_start: int | None = None
    step_end: int | None = None
    request: dict[str, Any] = field(default_factory=dict)  # SGLang ProfileReq fields common to every request

    @classmethod
    def from_config(cls, cfg: RelaxConfig) -> ProfileSpec | None:
        """None without --sglang-profile (the output directory is resolved by the config checks)."""
        p = cfg.engine_profile
        if not p.sglang_profile:
            return None
        steps = frozenset(p.sglang_profile_steps) if p.sglang_profile_steps is not None else None
        return cls(output_dir=p.sglang_profile_output_dir or "traces", steps=steps,
                   step_start=p.sglang_profile_step_start, step_end=p.sglang_profile_step_end,
                   request=profile_request(p))

    def selects(self, step: int) -> bool:
        if self.steps is not None:
            return step in self.steps
        low = 0 if self.step_start is None else self.step_start
        return low <= step and (self.step_end is None or step <= self.step_end)

    @property
    def engine_stops(self) -> bool:
        """The engine stops on its own after `num_steps` forward steps (no /stop_profile then)."""
        return self.request.get("num_steps") is not None

    def step_dir(self, step: int) -> str:
        return os.path.join(self.output_dir, f"rollout_{step}")

    def start_payload(self, step: int, engine: int) -> dict[str, Any]:
        """The /start_profile body for engine number `engine` in rollout step `step`."""
        return {**self.request, "output_dir": self.step_dir(step), "profile_prefix": f"engine{engine}"}


class EngineProfiler:
    """Starts and stops the engines' profilers around selected steps. `fleet`: anything with
    `urls` and `each_by_engine(call)` (`relax.engine.fleet.EngineFleet`); `spec` None: does nothing."""

    def __init__(self, spec: ProfileSpec | None, fleet: Any) -> None:
        self.spec, self.fleet = spec, fleet

    async def start(self, step: int) -> dict[str, float]:
        """Profile `step` when it is selected; its metrics (engines that refused, if any)."""
        if self.spec is None or not self.spec.selects(step):
            return {}
        index = {url: i for i, url in enumerate(self.fleet.urls)}
        logger.info("profiling the engines in rollout step %d into %s", step, self.spec.step_dir(step))
        return await self._each("/start_profile", lambda c: self.spec.start_payload(step, index.get(c.url, 0)))

    async def stop(self, step: int) -> dict[str, float]:
        """End the profile of `step`, unless the engines stop on their own (`num_steps`)."""
        if self.spec is None or not self.spec.selects(step) or self.spec.engine_stops:
            return {}
        return await self._each("/stop_profile", lambda c: {})

    async def _each(self, path: str, payload: Any) -> dict[str, float]:
        async def call(client: EngineClient) -> str | None:
            try:
                await client.post(path, payload(client))
            except EngineError as exc:  # a diagnostic never fails the step: logged and counted
                logger.warning("%s on %s failed: %s", path, client.url, exc)
                return str(exc)
            return None

        errors = [e for e in (await self.fleet.each_by_engine(call)).values() if e is not None]
        return {"profile/engine_errors": float(len(errors))} if errors else {}
