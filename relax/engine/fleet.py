"""`EngineFleet`: a set of inference engines of one backend behind one router.

Used for every engine the run starts: the Rollout's (which receive weights), the GenRM judges
and an engine-backed OPD teacher. A fleet launches its engines side by side through the
backend registry (`--rollout-backend`; the launch function returns an `EngineHandle`), waits
until each answers its health check (an engine that dies first raises with its log tail),
starts the router in front of them and keeps one HTTP client per engine. Engines can be added
and removed while it runs (`add`, `remove`), so a later health manager or an elastic rollout
only calls these. Launch from the process's long-lived event-loop thread: an engine's
parent-death signal fires when the launching thread exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from relax.backends.base import EngineHandle
from relax.backends.engine_client import EngineClient, EngineError
from relax.backends.registry import INFERENCE_BACKENDS
from relax.engine.rollout.generator import parse_weight_version
from relax.engine.router.router import Router
from relax.utils.plugins import import_object

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetSpec:
    """What every engine of a fleet is launched with."""

    name: str  # "rollout", "genrm", "teacher": the engines' log files are <log_dir>/<name>_engine_<i>.log
    backend: str  # --rollout-backend (resolved)
    model_path: str
    api_key: str | None = None
    log_dir: str = "."
    threads: int = 1  # torch threads per engine process (CPU)
    options: Mapping[str, Any] | None = None  # engine options (SGLang ServerArgs names)
    devices: tuple[str, ...] = ()  # per engine (default cpu)
    startup_timeout: float = 300.0
    http_timeout: float = 600.0
    log_names: tuple[str, ...] = field(default=())  # per-engine log file names (default <name>_engine_<i>.log)


class EngineFleet:
    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.engines: list[EngineHandle] = []
        self.clients: dict[str, EngineClient] = {}
        self.router: Router | None = None
        self._launched = 0

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self, count: int) -> None:
        """Launch `count` engines side by side, wait until all are healthy, start the router."""
        launched: list[EngineHandle] = []
        try:
            for _ in range(count):
                launched.append(self._launch())
            await asyncio.gather(*(asyncio.to_thread(e.wait_ready, self.spec.startup_timeout) for e in launched))
        except BaseException:
            for engine in launched:
                engine.terminate()
            raise
        for engine in launched:
            self._join(engine)
        self.router = Router(self.urls, api_key=self.spec.api_key, timeout_s=self.spec.http_timeout,
                             describe=self.describe)
        await self.router.start()
        logger.info("%s: %d %s engine(s) of %s behind %s", self.spec.name, count, self.spec.backend,
                    self.spec.model_path, self.router.url)

    async def add(self) -> str:
        """Launch one more engine; it joins the router once healthy. Returns its URL."""
        engine = self._launch()
        try:
            await asyncio.to_thread(engine.wait_ready, self.spec.startup_timeout)
        except BaseException:
            engine.terminate()
            raise
        self._join(engine)
        if self.router is not None:
            self.router.add_engine(engine.url)
        return engine.url

    async def remove(self, url: str) -> None:
        """Take one engine out of the router and stop it."""
        engine = next((e for e in self.engines if e.url == url), None)
        if engine is None:
            raise KeyError(f"{self.spec.name}: no engine at {url}; engines: {self.urls}")
        if self.router is not None:
            self.router.remove_engine(url)
        self.engines.remove(engine)
        await self.clients.pop(url).close()
        engine.terminate()

    async def stop(self) -> None:
        if self.router is not None:
            await self.router.stop()
            self.router = None
        for client in self.clients.values():
            await client.close()
        for engine in self.engines:
            engine.terminate()
        self.engines, self.clients = [], {}

    def _launch(self) -> EngineHandle:
        s, i = self.spec, self._launched
        self._launched += 1
        launch = import_object(INFERENCE_BACKENDS[s.backend], flag="--rollout-backend")
        log_name = s.log_names[i] if i < len(s.log_names) else f"{s.name}_engine_{i}.log"
        kwargs = {"device": s.devices[i]} if i < len(s.devices) else {}
        try:
            return launch(s.model_path, api_key=s.api_key, num_threads=s.threads,
                          log_path=os.path.join(s.log_dir, log_name), options=s.options, **kwargs)
        except ValueError as exc:  # a bad engine option: say which fleet it came from
            raise ValueError(f"{s.name} engine options: {exc}") from exc

    def _join(self, engine: EngineHandle) -> None:
        self.engines.append(engine)
        self.clients[engine.url] = EngineClient(engine.url, api_key=self.spec.api_key, timeout=60.0)

    # ---- what the roles ask of it ------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    @property
    def router_url(self) -> str:
        if self.router is None:
            raise RuntimeError(f"{self.spec.name}: the fleet is not started")
        return self.router.url

    def alive(self) -> int:
        return sum(e.alive() for e in self.engines)

    def describe(self, url: str) -> str:
        """The engine at `url`: pid, exited (code) / stopped / silent, its log and the log's end."""
        engine = next((e for e in self.engines if e.url == url), None)
        return engine.describe() if engine is not None else f"{url} is not an engine of the {self.spec.name} fleet"

    async def _call(self, url: str, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.clients[url], method)(*args)
        except EngineError as err:
            if err.status is not None and err.status < 500:
                raise  # the engine answered and refused: its message says why
            raise err.about(f"{self.spec.name} {self.describe(url)}") from err

    async def each(self, method: str, *args: Any) -> list[Any]:
        """`EngineClient.<method>(*args)` on every engine at once; results in engine order. An engine
        that does not answer fails the call with its process state and log tail."""
        return list(await asyncio.gather(*(self._call(url, method, *args) for url in self.clients)))

    async def weight_version(self) -> int:
        """The oldest weight version any engine holds (SGLang's "default" before an update is 0)."""
        return min(parse_weight_version(v) for v in await self.each("get_weight_version"))

    async def busy_seconds(self) -> list[float]:
        """Per engine: seconds spent in batched decoding so far (0 when the backend does not say)."""
        return [float(info.get("busy_seconds", 0.0)) for info in await self.each("get_server_info")]
