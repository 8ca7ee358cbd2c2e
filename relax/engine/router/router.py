"""A least-busy HTTP router in front of the inference engines.

It speaks the engines' own `/generate`, so default and custom generate functions post to
`http://{args.sglang_router_ip}:{args.sglang_router_port}/generate` exactly as they would
with SGLang's router. Engines can join and leave while it runs (`add_engine`,
`remove_engine`). Each request goes to the engine with the fewest requests in flight
(ties: round robin). It runs inside the Rollout process, bound to loopback, and adds the
run's engine API key so plugins never handle it.

Fault tolerance (`hold_s` > 0, `--use-fault-tolerance`): a request is never lost to an engine
that fails. An engine taken out (`remove_engine`, the health manager found it dead or hung) has its
requests in flight cancelled and sent again to another engine; a request whose connection broke
goes to another engine; while no engine is left (the last one is being replaced) requests wait up
to `hold_s` for one to join. Nothing came back from the failed engine, so each request still gets
exactly one reply. A request that failed on `MAX_ENGINE_FAILURES` engines (one that kills every
engine it reaches) fails instead of taking down the whole fleet.

Drain (elastic scale-in, `relax.engine.elastic`): a drained engine gets no new request
(`drain_engine`) while those it runs finish (`in_flight_at`); `evict_engine` then cancels what is
left there and sends each request again to another engine (nothing came back from the drained
one: still exactly one reply), counted in `drain_resent`.

SlimeRouter mode (`--use-slime-router`, `relax.engine.router.slime_router` builds it): user
middlewares wrap every route (`middlewares`), every other path is forwarded as it came to the least
busy engine (`proxy_all`: text prompts, /v1/chat/completions, ...), at most `max_connections` are
open to the engines, and a health watch (`background`) takes an engine that keeps failing its health
checks out of the pick (`mark_unhealthy`) until the fleet admits it again. A middleware may hand the
handlers a changed body as `request[JSON_BODY]`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any, Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web

logger = logging.getLogger(__name__)
ROUTE_ATTEMPTS = 3  # a generate request whose connection broke before any reply is sent again
MAX_ENGINE_FAILURES = 4  # fault tolerance: engines a request may see fail before it fails itself
FORWARDED_HEADERS = ("content-type", "accept")  # what the proxy passes on of a client's headers
JSON_BODY = web.RequestKey("relax_json_body", object)  # a middleware's replacement of the request body (SlimeRouter)


class EngineGone(Exception):
    """The engine a request was sent to was taken out of the router while it ran."""


class Router:
    def __init__(self, engine_urls: list[str], *, api_key: str | None = None, host: str = "127.0.0.1",
                 timeout_s: float = 600.0, describe: Callable[[str], str] | None = None,
                 hold_s: float = 0.0, defaults: dict[str, Any] | None = None,
                 middlewares: Sequence[Callable[[web.Application], Any]] = (), max_connections: int | None = None,
                 proxy_all: bool = False, background: Sequence[Callable[[Router], Awaitable[None]]] = ()) -> None:
        """`describe(url)`: what is known of an engine's process, added to a failed request's error.
        `hold_s` > 0: fault tolerance (see the module doc); requests wait that long for an engine.
        `defaults`: fields every forwarded request gets unless it sets them (`lora_path` of a LoRA run
        on SGLang engines, which serve an adapter only to requests that name it).
        SlimeRouter mode (module doc): `middlewares` (factories `make(app)` of aiohttp middlewares,
        outermost first), `max_connections` to the engines (None: no limit), `proxy_all`, and
        `background` coroutines `run(router)` that run while the router serves."""
        self.defaults = dict(defaults or {})
        self.middlewares, self.max_connections, self.proxy_all = list(middlewares), max_connections, proxy_all
        self.background, self._tasks = list(background), []
        self.unhealthy: set[str] = set()  # engines out of the pick after failed health checks (SlimeRouter)
        if not engine_urls:
            raise ValueError("Router needs at least one engine URL")
        self.hold_s = hold_s
        self.resent = 0  # requests sent again after their engine failed (fault tolerance), each counted once
        self.drain_resent = 0  # requests sent again because their engine was drained and evicted
        self.draining: set[str] = set()  # engines that get no new request (elastic scale-in)
        self._evicted: set[asyncio.Task] = set()  # forwards cancelled by `evict_engine` (sent again)
        self._running: dict[str, set[asyncio.Task]] = {}  # engine -> requests in flight there
        self._joined: asyncio.Event | None = None  # set when an engine joins (created in the loop)
        self.engine_urls = list(engine_urls)
        self.in_flight = {url: 0 for url in self.engine_urls}
        self.served = 0  # requests routed so far
        self.host, self.port = host, 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._rr = itertools.count()
        self._describe = describe
        self._reported: set[str] = set()  # engines whose failure was logged
        self._dropped: set[str] = set()  # engines whose dropped connection was logged
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def add_engine(self, url: str) -> None:
        """Route to `url` from now on (an engine that joined the fleet)."""
        if url not in self.in_flight:
            self.engine_urls.append(url)
            self.in_flight[url] = 0
        elif url in self.unhealthy:  # admitted again (e.g. it holds the current weights after a restart)
            self.unhealthy.discard(url)
            self.engine_urls.append(url)
        if self._joined is not None:
            self._joined.set()

    def remove_engine(self, url: str) -> int:
        """Stop routing to `url`. Without fault tolerance requests already sent there finish or fail
        on their own; with it they are sent again to another engine. Returns how many were re-sent."""
        if self.engine_urls == [url] and not self.hold_s:
            raise ValueError(f"cannot remove {url}: it is the router's last engine")
        if url in self.in_flight:
            if url in self.engine_urls:
                self.engine_urls.remove(url)
            del self.in_flight[url]
        self.draining.discard(url)
        self.unhealthy.discard(url)
        running = self._running.pop(url, set())
        for task in running:
            task.cancel(EngineGone.__name__)
        return len(running)

    def drain_engine(self, url: str) -> None:
        """Send `url` no new request; those it runs go on (`in_flight_at`) until evicted or done."""
        if url not in self.in_flight:
            raise KeyError(f"router: no engine {url}; engines: {self.engine_urls}")
        if self.engine_urls == [url]:
            raise ValueError(f"cannot drain {url}: it is the router's last engine taking requests")
        if url in self.engine_urls:
            self.engine_urls.remove(url)
        self.draining.add(url)

    def undrain_engine(self, url: str) -> None:
        """Send `url` requests again (a scale-in cancelled while it drained)."""
        if url in self.draining:
            self.draining.discard(url)
            self.engine_urls.append(url)

    def mark_unhealthy(self, url: str) -> None:
        """Send `url` no new requests (its health checks kept failing) until `add_engine` admits it again;
        those it runs finish or fail on their own."""
        if url in self.engine_urls:
            self.engine_urls.remove(url)
            self.unhealthy.add(url)

    def in_flight_at(self, url: str) -> int:
        """Requests running at `url` now (0 for an engine the router does not know)."""
        return self.in_flight.get(url, 0)

    def evict_engine(self, url: str) -> int:
        """Cancel the requests still running at drained engine `url`; each goes to another engine.
        Returns how many."""
        running = list(self._running.get(url, set()))
        for task in running:
            self._evicted.add(task)
            task.cancel(EngineGone.__name__)
        return len(running)

    def pick(self, avoid: set[str] | frozenset[str] = frozenset()) -> str:
        """The engine with the fewest requests in flight, other than `avoid` (engines that just failed
        this request) while there is another; ties broken round robin."""
        pool = [u for u in self.engine_urls if u not in avoid] or self.engine_urls
        least = min(self.in_flight[u] for u in pool)
        candidates = [u for u in pool if self.in_flight[u] == least]
        return candidates[next(self._rr) % len(candidates)]

    async def start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.middlewares.extend(make(app) for make in self.middlewares)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/list_workers", self._list_workers)
        if self.proxy_all:
            app.router.add_route("*", "/{path:.*}", self._proxy)
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=aiohttp.TCPConnector(
            limit=self.max_connections or 0, limit_per_host=0))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        logger.info("router on %s over %d engine(s)", self.url, len(self.engine_urls))
        self._tasks = [asyncio.ensure_future(run(self)) for run in self.background]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        try:
            payload: Any = request[JSON_BODY] if JSON_BODY in request else await request.json()
        except ValueError:
            return web.json_response({"error": "request body is not valid JSON"}, status=400)
        if not self.engine_urls and not self.hold_s:
            return web.json_response({"error": "no healthy engine to route to"}, status=503)
        if self.defaults and isinstance(payload, dict):
            payload = {**self.defaults, **payload}
        self.served += 1
        if self.hold_s:
            return await self._generate_tolerant(payload)
        failed: set[str] = set()
        attempt = 0
        while attempt < ROUTE_ATTEMPTS:
            url = self.pick(avoid=failed)
            task, _ = await self._forward_tracked(url, payload)
            if task.cancelled():  # evicted from a drained engine: nothing came back, send it again
                continue
            try:
                status, body = task.result()
                return web.Response(body=body, status=status, content_type="application/json")
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                timed_out = isinstance(exc, asyncio.TimeoutError)
                # The connection broke before a reply (a dropped keep-alive connection, an engine that
                # died): nothing came back, so the request goes out again, to the least busy engine.
                if (attempt + 1 < ROUTE_ATTEMPTS and not timed_out
                        and isinstance(exc, aiohttp.ClientConnectionError)):
                    failed.add(url)
                    attempt += 1
                    log = logger.debug if url in self._dropped else logger.warning  # once per engine
                    self._dropped.add(url)
                    log("engine %s dropped a request (%s); sending it again", url, exc)
                    continue
                what = "did not reply in time" if timed_out else "unreachable"
                details = f"\n{self._describe(url)}" if self._describe else ""
                if url not in self._reported:  # the engine's state and log once, not per request
                    self._reported.add(url)
                    logger.warning("engine %s %s: %r%s", url, what, exc, details)
                return web.json_response({"error": f"engine {url} {what}: {type(exc).__name__}: {exc}{details}"},
                                         status=504 if timed_out else 502)
        raise AssertionError("unreachable")

    async def _forward_tracked(self, url: str, payload: Any) -> tuple[asyncio.Task, bool]:
        """Forward `payload` to `url` as a task `evict_engine` (or `remove_engine`) can cancel; the
        finished task, and whether it was evicted from a drained engine (counted in `drain_resent`)."""
        self.in_flight[url] += 1
        task = asyncio.ensure_future(self._forward(url, payload))
        self._running.setdefault(url, set()).add(task)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:  # the client went away: so does the request
            task.cancel()
            raise
        finally:
            self._running.get(url, set()).discard(task)
            if url in self.in_flight:  # (the engine may have left the fleet meanwhile)
                self.in_flight[url] -= 1
        evicted = task in self._evicted
        if evicted:
            self._evicted.discard(task)
            self.drain_resent += 1
        return task, evicted

    async def _generate_tolerant(self, payload: Any) -> web.StreamResponse:
        """Fault tolerance: send the request on until an engine replies (see the module doc)."""
        loop = asyncio.get_running_loop()
        deadline, failed, gone, resent = loop.time() + self.hold_s, set(), 0, False
        while True:
            url = await self._engine_for(failed, deadline)
            if url is None:
                return web.json_response({"error": f"no engine could take the request for {self.hold_s:.0f}s (every "
                                                   "engine failed or was being replaced)"}, status=503)
            task, evicted = await self._forward_tracked(url, payload)
            if evicted:  # its engine was drained, not failed: send it again elsewhere
                continue
            exc = None if task.cancelled() else task.exception()
            if task.cancelled() or isinstance(exc, aiohttp.ClientConnectionError):
                # Taken out by the health manager, or the connection broke: no reply came, send it again.
                gone += task.cancelled()
                self.resent += not resent  # counted once per request, however often it goes out again
                resent, deadline = True, loop.time() + self.hold_s  # (the wait for an engine starts now)
                failed.add(url)
                if gone < MAX_ENGINE_FAILURES:
                    continue
                exc = exc or EngineGone(f"taken out of the router after failing ({MAX_ENGINE_FAILURES} engines "
                                        "failed under this request)")
            if exc is not None:
                timed_out = isinstance(exc, asyncio.TimeoutError)
                details = f"\n{self._describe(url)}" if self._describe else ""
                return web.json_response({"error": f"engine {url} {'did not reply in time' if timed_out else 'failed'}"
                                                   f": {type(exc).__name__}: {exc}{details}"},
                                         status=504 if timed_out else 502)
            status, body = task.result()
            return web.Response(body=body, status=status, content_type="application/json")

    async def _engine_for(self, failed: set[str], deadline: float) -> str | None:
        """The least busy engine this request has not failed on; while there is none, wait (up to the
        deadline) for an engine to join, retrying the failed ones every second (a dropped connection
        is not a dead engine). None once the deadline passed."""
        loop = asyncio.get_running_loop()
        while True:
            if any(u not in failed for u in self.engine_urls):
                return self.pick(avoid=failed)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            if self._joined is None:
                self._joined = asyncio.Event()
            joined = self._joined
            try:
                await asyncio.wait_for(joined.wait(), min(remaining, 1.0))
            except asyncio.TimeoutError:
                pass
            if joined.is_set():
                self._joined = asyncio.Event()  # the next wait is for the next engine
            failed.clear()

    async def _forward(self, url: str, payload: Any) -> tuple[int, bytes]:
        assert self._session is not None
        async with self._session.post(f"{url}/generate", json=payload, headers=self._headers) as resp:
            return resp.status, await resp.read()

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        """SlimeRouter: any other path, sent as it came (method, path, query, body; the run's key
        added) to the least busy engine, and its reply returned as it is."""
        if not self.engine_urls:
            return web.json_response({"error": "no healthy engine to route to"}, status=503)
        body = json.dumps(request[JSON_BODY]).encode() if JSON_BODY in request else await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS} | self._headers
        url = self.pick()
        self.in_flight[url] += 1
        assert self._session is not None
        try:
            async with self._session.request(request.method, url + request.path_qs, data=body, headers=headers) as resp:
                return web.Response(body=await resp.read(), status=resp.status, content_type=resp.content_type)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            what = "did not reply in time" if isinstance(exc, asyncio.TimeoutError) else "unreachable"
            return web.json_response({"error": f"engine {url} {what}: {type(exc).__name__}: {exc}"},
                                     status=504 if isinstance(exc, asyncio.TimeoutError) else 502)
        finally:
            if url in self.in_flight:
                self.in_flight[url] -= 1

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "engines": len(self.engine_urls)})

    async def _list_workers(self, request: web.Request) -> web.Response:
        return web.json_response({"urls": self.engine_urls, "in_flight": self.in_flight})
