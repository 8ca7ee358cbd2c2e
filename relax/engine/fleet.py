"""`EngineFleet`: a set of inference engines of one backend behind one router.

Used for every engine the run starts: the Rollout's (which receive weights), the GenRM judges
and an engine-backed OPD teacher (which keep their checkpoint's weights: a replacement needs no
push). A fleet launches its engines side by side through the backend registry
(`--rollout-backend`; the launch function returns an `EngineHandle`), waits until each answers
its health check (an engine that dies first raises with its log tail), starts the router in
front of them and keeps one HTTP client per engine. Engines can be added
and removed while it runs (`add`, `remove`), and a failed one replaced (`probe` finds engines that
died or stopped answering, `replace` swaps one for a fresh engine on the same device, `admit`
routes to it once it holds the current weights: `relax.core.health` drives these). With
`FleetSpec.hold_s` (`--use-fault-tolerance`) the router re-sends the requests of an engine taken
out, and a fleet-wide call that an engine fails waits for the health manager to replace it
instead of failing the step. Launch from the process's long-lived event-loop thread: an
engine's parent-death signal fires when the launching thread exits.

Elastic scaling (`relax.engine.elastic`) uses the same fleet: `launch` starts engines side by side
and `register` joins running ones (both tagged by operation, not yet routed: `admit` them once they
hold the current weights; `abandon` undoes a tag), `drain` stops routing to an engine (fleet-wide
calls, weight pushes included, skip it from then on), `in_flight_at` / `evict` finish its requests
and `release` lets it go. The engines the run started with are `protected` from scale-in.

External engines (`--rollout-external`, `FleetSpec.external`) join the same way as an
`ExternalEngine` handle: health-checked, routed to and sent every fleet-wide call (weights
included), but never launched or stopped here. The router is the built-in one
(`relax.engine.router.router`), or a router already running at `FleetSpec.router`
(`--sglang-router-ip/--sglang-router-port`), which gets the engines this fleet launches
registered with it, or sglang-router launched by the fleet (`FleetSpec.sglang_router`;
`relax.engine.router.remote`). sglang-router is not the default even when installed: 0.3.2
refuses batched requests with one `sampling_params` per item (HTTP 422), which is how the
default rollout sends a group.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

import httpx

from relax.backends.base import EngineHandle
from relax.backends.registry import INFERENCE_BACKENDS
from relax.distributed.engine_client import EngineClient, EngineError
from relax.engine.rollout.generator import parse_weight_version
from relax.engine.router.remote import RemoteRouter, launch_sglang_router, sglang_router_installed
from relax.engine.router.router import Router
from relax.engine.router.slime_router import SlimeRouterSpec, slime_router
from relax.utils.plugins import import_object
from relax.utils.poll import Backoff

logger = logging.getLogger(__name__)

# One engine's call through its client: `lambda c: c.get_server_info()`.
ClientCall = Callable[[EngineClient], Awaitable[Any]]


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
    external: tuple[str, ...] = ()  # URLs of running engines that join (never launched or stopped here)
    router: str | None = None  # URL of a running router to use instead of starting one
    sglang_router: bool = False  # launch sglang-router instead of the built-in router (see the module doc)
    # --use-fault-tolerance: how long a request or fleet call waits for a failed engine's replacement
    # (0: fault tolerance off, an engine failure fails the call)
    hold_s: float = 0.0
    # Fields added to every /generate request the built-in router forwards, unless the request sets them
    # (a LoRA run on SGLang engines: `lora_path`, the adapter's name).
    generate_defaults: Mapping[str, Any] | None = None
    # --use-slime-router: the built-in router in slime's mode (middlewares, every path; router/slime_router.py)
    slime_router: SlimeRouterSpec | None = None


class EngineReplaced(RuntimeError):
    """A fleet-wide call reached an engine that was taken out (replaced) meanwhile."""


class ExternalEngine:
    """An engine Relax did not launch: `wait_ready` polls its health, `terminate` does nothing."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url, self._api_key = url.rstrip("/"), api_key
        self._healthy, self._last = False, "not checked yet"

    def _probe(self, client: httpx.Client, timeout: float) -> bool:
        try:
            status = client.get(self.url + "/health", timeout=timeout).status_code
            self._last = f"GET /health -> HTTP {status}"
        except httpx.HTTPError as exc:
            status, self._last = None, f"GET /health failed: {type(exc).__name__}: {exc}"
        self._healthy = status == 200
        return self._healthy

    def wait_ready(self, timeout: float) -> None:
        """Poll GET /health until 200, then check the engine takes the run's API key."""
        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False) as client:  # (one TLS context for every poll: ~22 ms of CPU each)
            while not self._probe(client, timeout=min(5.0, max(0.5, timeout))):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"external engine at {self.url} is not healthy after {timeout:.0f}s "
                                       f"({self._last}); start it first, or fix its address in "
                                       "--rollout-external-engine-addrs (this host must reach it)")
                time.sleep(0.5)
            # Every weight update flushes the cache with the run's key; an engine started with a key of its
            # own refuses it here rather than at the first update.
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            status = client.post(self.url + "/flush_cache", headers=headers, timeout=30.0).status_code
        if status in (401, 403):
            raise RuntimeError(f"external engine at {self.url} refuses the run's API key (HTTP {status}): it was "
                               "started with --api-key, and Relax authenticates with a key it generates per run; start "
                               "it without --api-key, reachable on the cluster's private network only")

    def alive(self) -> bool:
        return self._healthy  # as of the last health check (no request from here)

    def describe(self) -> str:
        return f"external engine at {self.url} (not launched by Relax); last health check: {self._last}"

    def terminate(self, timeout: float = 10.0) -> None:
        """Never launched by Relax, so never stopped by it."""


class EngineFleet:
    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.engines: list[EngineHandle] = []
        self.clients: dict[str, EngineClient] = {}
        self.router: Router | RemoteRouter | None = None
        self._launched = 0
        self._slots: dict[str, tuple[str | None, str]] = {}  # engine URL -> (device, log file name)
        self._calls: dict[str, set[asyncio.Task]] = {}  # engine URL -> fleet calls in flight there
        self.replaced = 0  # engines replaced so far
        self.protected: set[str] = set()  # the engines the run started with: never scaled in
        self.draining: set[str] = set()  # engines leaving: no new requests, no fleet-wide calls
        self.ids: dict[str, str] = {}  # engine URL -> its id in the scaling API ("engine-3", "external-0")
        self._tags: dict[str, list[EngineHandle]] = {}  # scaling operation -> engines it launched or registered
        self._abandoned: set[str] = set()  # operations undone (`abandon`): their engines still starting stop
        self._joined: Counter[str] = Counter()  # engines joined so far, launched / external (their ids)

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self, count: int) -> None:
        """Launch `count` engines side by side and join the spec's external ones; once all are
        healthy, start the router (or reach the spec's)."""
        s = self.spec
        engines: list[EngineHandle] = [ExternalEngine(url, s.api_key) for url in s.external]
        try:
            for _ in range(count):
                engines.append(self._launch())
            await asyncio.gather(*(asyncio.to_thread(e.wait_ready, s.startup_timeout) for e in engines))
            for engine in engines:
                self._join(engine)
            self.protected = set(self.urls)
            self.router = await self._start_router()
        except BaseException:
            for engine in engines:
                engine.terminate()
            for client in self.clients.values():
                await client.close()
            self.engines, self.clients = [], {}
            raise
        logger.info("%s: %d %s engine(s)%s of %s behind %s", s.name, count, s.backend,
                    f" and {len(s.external)} external one(s)" if s.external else "", s.model_path, self.router.url)

    async def _start_router(self) -> Router | RemoteRouter:
        """A router someone runs gets the engines this fleet launched; a launched sglang-router or the
        built-in router gets every engine."""
        s = self.spec
        if s.sglang_router and s.router is None and not sglang_router_installed():
            raise RuntimeError(f"{s.name}: sglang-router is not installed (pip install sglang-router)")
        if s.router is None and not s.sglang_router:
            kwargs = dict(api_key=s.api_key, timeout_s=s.http_timeout, describe=self.describe, hold_s=s.hold_s,
                          defaults=s.generate_defaults)
            router = Router(self.urls, **kwargs) if s.slime_router is None else slime_router(
                self.urls, s.slime_router, **kwargs)
            await router.start()
            return router
        if s.router is not None:
            remote, joining = RemoteRouter(s.router, api_key=s.api_key), [e.url for e in self.engines
                                                                          if not isinstance(e, ExternalEngine)]
        else:
            remote = launch_sglang_router(os.path.join(s.log_dir, f"{s.name}_router.log"), timeout_s=s.http_timeout,
                                          api_key=s.api_key)
            joining = self.urls
        try:
            await remote.start()
            for url in joining:
                await remote.add_engine(url)
        except BaseException:
            await remote.stop()
            raise
        return remote

    async def _route(self, method: str, url: str) -> None:
        """`add_engine` / `remove_engine` on the router (the built-in one's are plain calls)."""
        result = getattr(self.router, method)(url)
        if inspect.isawaitable(result):
            await result

    async def add(self, *, route: bool = True, device: str | None = None, log_name: str | None = None) -> str:
        """Launch one more engine (on `device`, logging to `log_name`; default: the next slot's); it
        joins the fleet once healthy, and the router too unless `route=False` (then `admit` it).
        Returns its URL."""
        engine = self._launch(device, log_name)
        try:
            await asyncio.to_thread(engine.wait_ready, self.spec.startup_timeout)
        except BaseException:
            engine.terminate()
            raise
        self._join(engine)
        if route:
            await self.admit(engine.url)
        return engine.url

    async def admit(self, url: str) -> None:
        """Route requests to the fleet's engine at `url` (one `add(route=False)` launched)."""
        if self.router is not None:
            await self._route("add_engine", url)

    async def replace(self, url: str) -> str:
        """Take the failed engine at `url` out (its requests in flight are re-sent, with fault
        tolerance), stop it, and launch a fresh one on the same device. The new engine is in the
        fleet but not yet routed to: it needs the current weights first, then `admit(new_url)`."""
        engine = next((e for e in self.engines if e.url == url), None)
        if engine is None:
            raise KeyError(f"{self.spec.name}: no engine at {url}; engines: {self.urls}")
        if isinstance(engine, ExternalEngine):
            raise RuntimeError(f"{self.spec.name}: {engine.describe()}; Relax cannot restart an engine it did not "
                               "launch: restart it at the same address, or run without --rollout-external")
        device, log_name = self._slots.get(url, (None, f"{self.spec.name}_engine.log"))
        protected = url in self.protected
        await self.remove(url, wait_s=1.0)  # SIGKILL after 1 s: a stopped (hung) engine ignores SIGTERM
        self.replaced += 1
        stem, _, ext = log_name.rpartition(".")
        stem = re.sub(r"\.restart\d+$", "", stem)  # a replacement's replacement: engine_0.restart2.log
        new = await self.add(route=False, device=device, log_name=f"{stem}.restart{self.replaced}.{ext}")
        if protected:  # a startup engine's replacement takes its place, protection included
            self.protected.add(new)
        return new

    async def probe(self, timeout: float) -> list[tuple[str, str]]:
        """(url, what is wrong) for every engine that died, or that did not answer GET /health within
        `timeout` seconds (hung, e.g. stopped by SIGSTOP); healthy engines are left out."""
        async def check(engine: EngineHandle) -> str | None:
            client = self.clients.get(engine.url)
            if client is None:  # it left the fleet meanwhile (scaled in)
                return None
            if not engine.alive() and not isinstance(engine, ExternalEngine):
                return "died"
            if await client.health(timeout=timeout):
                return None
            return f"no answer to GET /health within {timeout:g}s" if engine.alive() else "died"

        engines = list(self.engines)
        found = await asyncio.gather(*(check(e) for e in engines))
        return [(e.url, f"{why}: {e.describe()}") for e, why in zip(engines, found) if why is not None]

    async def remove(self, url: str, wait_s: float = 10.0) -> None:
        """Take one engine out of the router and stop it (SIGTERM, SIGKILL after `wait_s`); an
        external one only leaves the fleet. Fleet calls in flight to it end (`EngineReplaced`)."""
        engine = next((e for e in self.engines if e.url == url), None)
        if engine is None:
            raise KeyError(f"{self.spec.name}: no engine at {url}; engines: {self.urls}")
        if self.router is not None:
            await self._route("remove_engine", url)
        self.engines.remove(engine)
        self._slots.pop(url, None)
        self.draining.discard(url)
        self.protected.discard(url)
        self.ids.pop(url, None)
        for task in self._calls.pop(url, set()):
            task.cancel()
        await self.clients.pop(url).close()
        await asyncio.to_thread(engine.terminate, wait_s)

    async def stop(self) -> None:
        """Stop the router this fleet started (a running one forgets the engines registered with it) and
        the engines it launched; external engines keep running."""
        if self.router is not None:
            await self.router.stop()
            self.router = None
        for client in self.clients.values():
            await client.close()
        for engine in self.engines:
            engine.terminate()
        self.engines, self.clients = [], {}

    def _launch(self, device: str | None = None, log_name: str | None = None) -> EngineHandle:
        s, i = self.spec, self._launched
        self._launched += 1
        launch = import_object(INFERENCE_BACKENDS[s.backend], flag="--rollout-backend")
        log_name = log_name or (s.log_names[i] if i < len(s.log_names) else f"{s.name}_engine_{i}.log")
        device = device or (s.devices[i] if i < len(s.devices) else None)
        kwargs = {"device": device} if device is not None else {}
        try:
            engine = launch(s.model_path, api_key=s.api_key, num_threads=s.threads,
                            log_path=os.path.join(s.log_dir, log_name), options=s.options, **kwargs)
        except ValueError as exc:  # a bad engine option: say which fleet it came from
            raise ValueError(f"{s.name} engine options: {exc}") from exc
        self._slots[engine.url] = (device, log_name)
        return engine

    def _join(self, engine: EngineHandle) -> None:
        self.engines.append(engine)
        self.clients[engine.url] = EngineClient(engine.url, api_key=self.spec.api_key, timeout=60.0)
        kind = "external" if isinstance(engine, ExternalEngine) else "engine"
        self.ids[engine.url] = f"{kind}-{self._joined[kind]}"  # never reused within the run
        self._joined[kind] += 1

    # ---- what the roles ask of it ------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    @property
    def router_url(self) -> str:
        if self.router is None:
            raise RuntimeError(f"{self.spec.name}: the fleet is not started")
        return self.router.url

    def device_of(self, url: str) -> str | None:
        """The device the engine at `url` was launched on (None: the backend's default, or external)."""
        return self._slots.get(url, (None, ""))[0]

    def alive(self) -> int:
        return sum(e.alive() for e in self.engines)

    def requests_resent(self) -> int:
        """Requests the built-in router sent again after their engine failed, so far (fault tolerance)."""
        return getattr(self.router, "resent", 0)

    def describe(self, url: str) -> str:
        """The engine at `url`: pid, exited (code) / stopped / silent, its log and the log's end."""
        engine = next((e for e in self.engines if e.url == url), None)
        return engine.describe() if engine is not None else f"{url} is not an engine of the {self.spec.name} fleet"

    # ---- elastic scaling (relax.engine.elastic) -------------------------------------------
    async def launch(self, count: int, timeout: float, tag: str,
                     devices: list[str] | None = None) -> list[dict[str, str]]:
        """Launch `count` engines side by side for operation `tag` (on `devices`, one per engine, where
        given); per engine {"url"} once it joined the fleet healthy within `timeout` seconds (not
        routed to: `admit` it), else {"error"} (it was stopped). A bad engine option raises
        ValueError before any starts."""
        self._abandoned.discard(tag)
        engines = [self._launch(device=devices[i] if devices else None) for i in range(count)]
        self._tags.setdefault(tag, []).extend(engines)
        return list(await asyncio.gather(*(self._ready(e, timeout, tag) for e in engines)))

    async def register(self, url: str, timeout: float, tag: str) -> dict[str, str]:
        """Join the running engine at `url` for operation `tag` (never launched or stopped here; not
        routed to until `admit`); {"url"} or {"error"}."""
        if url in self.clients:
            return {"error": f"{url} is already an engine of the {self.spec.name} fleet"}
        engine = ExternalEngine(url, self.spec.api_key)
        self._tags.setdefault(tag, []).append(engine)
        return await self._ready(engine, timeout, tag)

    async def _ready(self, engine: EngineHandle, timeout: float, tag: str) -> dict[str, str]:
        try:
            await asyncio.to_thread(engine.wait_ready, timeout)
        except Exception as exc:  # noqa: BLE001 - one engine's failure is reported, the policy decides
            engine.terminate(1.0)
            return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:2000]}
        if tag in self._abandoned:  # the operation was undone while this engine started
            engine.terminate(1.0)
            return {"error": "the operation was cancelled while the engine started"}
        self._join(engine)
        return {"url": engine.url}

    async def abandon(self, tag: str, wait_s: float = 10.0) -> list[str]:
        """Undo operation `tag`: every engine it launched is stopped (external ones released); those
        still starting stop when ready. Returns the URLs that had joined."""
        self._abandoned.add(tag)
        engines = self._tags.pop(tag, [])
        joined = [e.url for e in engines if e.url in self.clients]
        for url in joined:
            await self.release(url, wait_s)
        for engine in engines:  # still starting (its launch was cancelled): stop it now
            if engine.url not in joined:
                await asyncio.to_thread(engine.terminate, 1.0)
        return joined

    def drain(self, url: str) -> None:
        """Route no new request to `url` (those it runs go on); fleet-wide calls skip it from now on."""
        if url not in self.clients:
            raise KeyError(f"{self.spec.name}: no engine at {url}; engines: {self.urls}")
        if not isinstance(self.router, Router):
            raise RuntimeError(f"{self.spec.name}: draining an engine needs the built-in router; this fleet routes "
                               f"through {getattr(self.router, 'url', None)} (--sglang-router-ip or sglang-router)")
        self.router.drain_engine(url)
        self.draining.add(url)

    def undrain(self, url: str) -> None:
        """Route to a drained engine again (a cancelled scale-in)."""
        if url in self.draining and isinstance(self.router, Router):
            self.router.undrain_engine(url)
        self.draining.discard(url)

    def in_flight_at(self, url: str) -> int:
        return self.router.in_flight_at(url) if isinstance(self.router, Router) else 0

    def evict(self, url: str) -> int:
        """The requests still running at drained engine `url` go to the other engines (`Router.evict_engine`)."""
        return self.router.evict_engine(url) if isinstance(self.router, Router) else 0

    async def release(self, url: str, wait_s: float) -> None:
        """Let the engine at `url` go: out of the router; stopped (SIGTERM, killed after `wait_s`) if the
        run launched it, left running if external."""
        await self.remove(url, wait_s=wait_s)

    def table(self) -> list[dict[str, Any]]:
        """Every engine: id, address, state (active / joining / draining), protected, external."""
        routed = set(getattr(self.router, "engine_urls", self.urls))
        return [{"id": self.ids.get(e.url, e.url), "address": e.url, "protected": e.url in self.protected,
                 "external": isinstance(e, ExternalEngine),
                 "state": "draining" if e.url in self.draining else "active" if e.url in routed else "joining"}
                for e in self.engines]

    async def _call(self, url: str, call: ClientCall) -> Any:
        try:
            return await call(self.clients[url])
        except EngineError as err:
            if err.status is not None and err.status < 500:
                raise  # the engine answered and refused: its message says why
            raise err.about(f"{self.spec.name} {self.describe(url)}") from err

    async def _tolerant_call(self, url: str, call: ClientCall) -> Any:
        """With fault tolerance: a call that gets no reply (the engine died or hangs) waits, up to
        `hold_s`, for the health manager to take the engine out, then raises `EngineReplaced` (the
        caller skips it)."""
        task = asyncio.ensure_future(self._call(url, call))
        self._calls.setdefault(url, set()).add(task)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._calls.get(url, set()).discard(task)
        if task.cancelled():
            raise EngineReplaced(url)
        err = task.exception()
        if not isinstance(err, EngineError) or err.status is not None:
            return task.result()  # the reply, or the engine's own answer (raised): it is alive
        deadline = time.monotonic() + self.spec.hold_s
        while url in self.clients and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if url in self.clients:
            raise err
        raise EngineReplaced(url) from err

    async def each(self, call: ClientCall) -> list[Any]:
        """`call(client)` (e.g. `lambda c: c.flush_cache()`) on every engine's `EngineClient` at once;
        results in engine order. An engine that does not answer fails the call with its process
        state and log tail; with fault tolerance (`hold_s`) an engine replaced meanwhile is left
        out of the results instead."""
        return list((await self.each_by_engine(call)).values())

    async def each_by_engine(self, call: ClientCall) -> dict[str, Any]:
        """`each`, keyed by engine URL."""
        urls = [u for u in self.clients if u not in self.draining]  # a draining engine is leaving
        if not self.spec.hold_s:
            return dict(zip(urls, await asyncio.gather(*(self._call(u, call) for u in urls))))
        results = await asyncio.gather(*(self._tolerant_call(u, call) for u in urls), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, EngineReplaced):
                raise result
        return {u: r for u, r in zip(urls, results) if not isinstance(r, EngineReplaced)}

    async def weight_version(self) -> int:
        """The oldest weight version any engine holds (SGLang's "default" before an update is 0; 0 while
        every engine is being replaced)."""
        return min((parse_weight_version(v) for v in await self.each(lambda c: c.get_weight_version())), default=0)

    async def wait_weight_version(self, minimum: int, alive: Callable[[], bool]) -> int:
        """Poll until every engine holds weight version `minimum` or later (or `alive()` turns
        False); the oldest version held."""
        backoff = Backoff(max_s=0.05)  # each poll is an HTTP call to every engine
        while alive():
            version = await self.weight_version()
            if version >= minimum:
                return version
            await backoff.wait()
        return minimum

    async def busy_seconds(self) -> dict[str, float]:
        """Per engine URL: seconds spent in batched decoding so far (0 when the backend does not say)."""
        infos = await self.each_by_engine(lambda c: c.get_server_info())
        return {url: float(info.get("busy_seconds", 0.0)) for url, info in infos.items()}


class NoFleet:
    """The fleet of a role that runs no engines (a replay of saved rollouts,
    --load-debug-rollout-data / --debug-train-only): nothing to route to, probe, push or release."""

    urls: list[str] = []
    router_url: str | None = None
    draining: frozenset[str] = frozenset()

    async def stop(self) -> None:
        """Nothing was started."""

    async def probe(self, timeout: float) -> list[tuple[str, str]]:
        return []

    def requests_resent(self) -> int:
        return 0

    def device_of(self, url: str) -> str | None:
        return None

    async def each(self, call: ClientCall) -> list[Any]:
        return []

    async def each_by_engine(self, call: ClientCall) -> dict[str, Any]:
        return {}

    async def weight_version(self) -> int:
        return 0

    async def wait_weight_version(self, minimum: int, alive: Callable[[], bool]) -> int:
        """No engines: the Actor's version stands for theirs."""
        return max(minimum, 0)

    async def busy_seconds(self) -> dict[str, float]:
        return {}

