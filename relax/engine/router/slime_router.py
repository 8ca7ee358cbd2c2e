"""SlimeRouter (`--use-slime-router`): the built-in router (`router.Router`) in slime's mode.

slime's SlimeRouter forwards every path it is sent to the least busy engine (text prompts, so a
workflow can speak text while the trainer gets tokens), runs user middlewares around each request,
has its own request timeout and connection limit, and checks each engine's health on a timer: an
engine that fails `--slime-router-health-check-failure-threshold` checks in a row gets no more
requests. Here the same router that serves the default rollout does all of that
(`slime_router(...)` builds it): middlewares are classes loaded by dotted path
(`relax.config.router.middleware_class`, the contract is there), constructed once as
`Middleware(app, router=router)` and called as `await m.dispatch(request, call_next)`;
`HealthWatch` is the timer. An engine taken out this way comes back when the fleet admits it again
(a replacement, or an elastic re-admission), never on its own: it may have missed a weight push.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from relax.config.router import middleware_class
from relax.config.schema import RelaxConfig
from relax.engine.router.router import Router

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlimeRouterSpec:
    """The SlimeRouter flags, and the health watch's period and deadline (--rollout-health-check-interval,
    --rollout-health-check-timeout)."""

    middleware_paths: tuple[str, ...] = ()
    timeout_s: float | None = None  # None: the run's --http-timeout
    max_connections: int | None = None
    failure_threshold: int = 3
    check_interval_s: float = 30.0
    check_timeout_s: float = 30.0

    @classmethod
    def from_config(cls, cfg: RelaxConfig) -> SlimeRouterSpec | None:
        """None without --use-slime-router."""
        r = cfg.router
        if not r.use_slime_router:
            return None
        return cls(middleware_paths=tuple(r.slime_router_middleware_paths or ()), timeout_s=r.slime_router_timeout,
                   max_connections=r.slime_router_max_connections,
                   failure_threshold=r.slime_router_health_check_failure_threshold,
                   check_interval_s=cfg.fault.rollout_health_check_interval,
                   check_timeout_s=cfg.fault.rollout_health_check_timeout)


def slime_router(engine_urls: list[str], spec: SlimeRouterSpec, **router_kwargs: Any) -> Router:
    """A `Router` over `engine_urls` in SlimeRouter mode (`router_kwargs`: the fleet's usual ones;
    `spec.timeout_s` replaces its timeout when set)."""
    if spec.timeout_s is not None:
        router_kwargs["timeout_s"] = spec.timeout_s
    watch = HealthWatch(spec.failure_threshold, spec.check_interval_s, spec.check_timeout_s)
    router = Router(engine_urls, max_connections=spec.max_connections, proxy_all=True, background=[watch.run],
                    **router_kwargs)
    router.middlewares = [_factory(middleware_class(path), router) for path in spec.middleware_paths]
    return router


def _factory(cls: type, router: Router) -> Any:
    """`make(app)`: the middleware constructed for `app`, as an aiohttp middleware."""
    def make(app: web.Application) -> Any:
        instance = cls(app, router=router)

        @web.middleware
        async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
            return await instance.dispatch(request, handler)

        return middleware
    return make


class HealthWatch:
    """Every `interval_s`, GET /health on each engine the router sends requests to; `threshold`
    failures in a row (no 200 within `timeout_s`) take it out of the pick (`Router.mark_unhealthy`)."""

    def __init__(self, threshold: int, interval_s: float, timeout_s: float = 30.0) -> None:
        self.threshold, self.interval_s, self.timeout_s = threshold, interval_s, timeout_s
        self.failures: dict[str, int] = {}  # engine -> consecutive failed checks

    async def run(self, router: Router) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                         trust_env=False) as session:
            while True:
                await asyncio.sleep(self.interval_s)
                await self.check(router, session)

    async def check(self, router: Router, session: aiohttp.ClientSession) -> list[str]:
        """One round over the routed engines; the engines taken out in it."""
        urls = list(router.engine_urls)
        healthy = await asyncio.gather(*(_healthy(session, url) for url in urls))
        taken = []
        for url, ok in zip(urls, healthy):
            self.failures[url] = 0 if ok else self.failures.get(url, 0) + 1
            if self.failures[url] >= self.threshold and url in router.engine_urls:
                logger.warning("SlimeRouter: engine %s failed %d health checks in a row; no new requests go to it "
                               "until the fleet admits it again", url, self.failures[url])
                router.mark_unhealthy(url)
                self.failures[url] = 0
                taken.append(url)
        return taken


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/health") as resp:
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):  # unreachable or hung: a failed check
        return False
