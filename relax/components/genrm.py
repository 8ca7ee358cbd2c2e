"""GenRM role: the judge model's inference engines behind one router (LLM-as-judge rewards).

Deployed by the Controller when `--genrm-model-path` is set. It launches
`--genrm-num-gpus / --genrm-num-gpus-per-engine` engines of the run's inference backend
(`--rollout-backend`; on CPU each is one engine process) from `--genrm-model-path`, with
`--genrm-engine-config` as engine options, and starts a router in front of them. `setup()`
returns the router URL; the Rollout hands it to the `genrm` reward type
(`relax.engine.rewards.genrm`), which builds the judge prompts and parses the verdicts. The
judge's weights never change during the run (no weight sync).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from relax.backends.registry import INFERENCE_BACKENDS
from relax.config.schema import RelaxConfig
from relax.engine.router.router import Router
from relax.utils.http_utils import close_sessions
from relax.utils.logging import run_token, setup_logging
from relax.utils.plugins import import_object

logger = logging.getLogger(__name__)


def num_engines(cfg: RelaxConfig) -> int:
    """Judge engines: --genrm-num-gpus / --genrm-num-gpus-per-engine (validated to divide)."""
    return max(1, cfg.reward.genrm_num_gpus // max(1, cfg.reward.genrm_num_gpus_per_engine))


def needs_genrm(cfg: RelaxConfig) -> bool:
    """The run deploys the GenRM role (a judge model is given)."""
    return bool(cfg.reward.genrm_model_path)


class GenRM:
    def __init__(self, cfg: RelaxConfig) -> None:
        setup_logging()
        self.cfg = cfg
        self.token = run_token()
        self.engines: list[Any] = []
        self.router: Router | None = None

    async def setup(self) -> dict[str, Any]:
        """Launch the judge engines, wait until they are healthy, start the router."""
        if not self.cfg.reward.genrm_model_path:
            raise ValueError("GenRM role deployed without --genrm-model-path; set it to the judge model directory")
        # Launched from the replica's long-lived event-loop thread (the engines' parent-death
        # signal fires when the launching thread exits).
        self.engines = self._launch_engines()
        timeout = self.cfg.rollout.engine_startup_timeout
        await asyncio.gather(*(asyncio.to_thread(e.wait_ready, timeout) for e in self.engines))
        self.router = Router([e.url for e in self.engines], api_key=self.token, timeout_s=self.cfg.rollout.http_timeout)
        await self.router.start()
        logger.info("GenRM: %d judge engine(s) of %s behind %s", len(self.engines),
                    self.cfg.reward.genrm_model_path, self.router.url)
        return {"url": self.router.url, "engine_urls": self.engine_urls()}

    def _launch_engines(self) -> list[Any]:
        backend = self.cfg.cluster.rollout_backend
        launch = import_object(INFERENCE_BACKENDS[backend], flag="--rollout-backend")
        n = num_engines(self.cfg)
        threads = self.cfg.cluster.engine_threads or max(1, (os.cpu_count() or 1) // n)
        log_dir = self.cfg.misc.exp_dir or "."
        engines = []
        try:
            for i in range(n):
                engines.append(launch(self.cfg.reward.genrm_model_path, api_key=self.token, num_threads=threads,
                                      log_path=os.path.join(log_dir, f"genrm_engine_{i}.log"),
                                      options=self.cfg.reward.genrm_engine_config))
        except ValueError as exc:  # a bad engine option: name the flag
            for engine in engines:
                engine.terminate()
            raise ValueError(f"--genrm-engine-config: {exc}") from exc
        return engines

    def engine_urls(self) -> list[str]:
        return [e.url for e in self.engines]

    async def stats(self) -> dict[str, float]:
        """Judge requests served so far, requests in flight, and live engines."""
        router = self.router
        return {"genrm/requests": float(router.served if router else 0),
                "genrm/in_flight": float(sum(router.in_flight.values()) if router else 0),
                "genrm/engines_alive": float(sum(e.alive() for e in self.engines))}

    async def shutdown(self) -> None:
        if self.router is not None:
            await self.router.stop()
            self.router = None
        for engine in self.engines:
            engine.terminate()
        self.engines = []
        await close_sessions()
