"""The rollout's HTTP flags (`RouterConfig`, one config group of `schema.RelaxConfig`, kept apart from
schema.py for its size): the SlimeRouter, `--http-proxy` and `--use-distributed-post`; their checks,
and the middleware contract.

slime's SlimeRouter (`--use-slime-router`) is a router in front of the engines that forwards every
path it is sent (text prompts to /generate, /v1/chat/completions, ...) to the least busy engine,
through user middlewares, with its own request timeout, connection limit and health checks (an
engine that fails N health checks in a row gets no more requests). Here it is the built-in router
(`relax.engine.router.router`) in that mode (`relax.engine.router.slime_router`): the flags keep
slime's names and meaning.

A middleware is a class named by dotted path, constructed once as `Middleware(app, *, router)` and
called for every request as `await middleware.dispatch(request, call_next)`, the shape of slime's
(Starlette's `BaseHTTPMiddleware`); the router here serves aiohttp, so `request` is an
`aiohttp.web.Request` (`await request.json()` reads the body; `request[JSON_BODY] = payload`, with
`JSON_BODY` from `relax.engine.router.router`, hands the next step a changed body) and
`call_next(request)` returns an `aiohttp.web.Response`. A Starlette middleware is refused at start
with what to change. No aiohttp import here (config is a leaf).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from relax.config.fields import opt

MIDDLEWARE_SIGNATURE = ("class Middleware(app, *, router) with async def dispatch(self, request, call_next) -> "
                        "response (aiohttp web.Request / web.Response)")
MIDDLEWARE_FLAG = "--slime-router-middleware-paths"


@dataclass(frozen=True)
class RouterConfig:
    """The rollout's HTTP: slime's SlimeRouter (the built-in router forwarding every path through middlewares,
    docs/router.md), the proxy for services outside the run, slime's distributed posting."""

    use_slime_router: bool = opt(False, "SlimeRouter, as slime's: the built-in router forwards every path it is "
                                 "sent (text prompts to /generate, /v1/chat/completions, /get_model_info, ...) to "
                                 "the least busy engine, through the middlewares of --slime-router-middleware-paths, "
                                 "with its own timeout, connection limit and health checks (docs/router.md).")
    slime_router_middleware_paths: list | None = opt(
        None, "SlimeRouter middlewares, outermost first: dotted paths of classes Middleware(app, *, router) with "
        "async dispatch(request, call_next) -> response; requests and responses are aiohttp's (docs/router.md).",
        nargs="+")
    slime_router_timeout: float | None = opt(None, "SlimeRouter: seconds one forwarded request may take before the "
                                             "caller gets HTTP 504 (default: --http-timeout).")
    slime_router_max_connections: int | None = opt(None, "SlimeRouter: most connections open to the engines at "
                                                   "once; further requests wait for one (default: no limit).")
    slime_router_health_check_failure_threshold: int = opt(
        3, "SlimeRouter: an engine that fails this many health checks in a row (GET /health every "
        "--rollout-health-check-interval seconds) gets no new requests until it is admitted to the fleet again.")
    http_proxy: str | None = opt(None, "HTTP(S) proxy URL (http://host:port) for calls to services outside the run: "
                                 "the remote reward service of --rm-type remote_rm; the run's own engines, routers "
                                 "and judges are always reached directly.")
    use_distributed_post: bool = opt(False, "Distributed POST requests.", ignored=(
        "slime spreads its rollout HTTP posts over Ray actors on every node because one Python client was its "
        "bottleneck; here requests go out through one pooled aiohttp session to the router in the Rollout process, "
        "which forwards to every engine, so posting from other processes would add a hop, not capacity"))


def check_router_values(values: RouterConfig) -> None:
    """Ranges of the SlimeRouter flags and every middleware class; ValueError naming the flag and the fix."""
    if values.slime_router_timeout is not None and not values.slime_router_timeout > 0:
        raise ValueError(f"--slime-router-timeout must be > 0 seconds, got {values.slime_router_timeout}")
    if values.slime_router_max_connections is not None and values.slime_router_max_connections < 1:
        raise ValueError(f"--slime-router-max-connections must be >= 1, got {values.slime_router_max_connections} "
                         "(leave it unset for no limit)")
    if values.slime_router_health_check_failure_threshold < 1:
        raise ValueError("--slime-router-health-check-failure-threshold must be >= 1, got "
                         f"{values.slime_router_health_check_failure_threshold}")
    if values.use_slime_router:
        for path in values.slime_router_middleware_paths or ():
            middleware_class(path)
    if values.http_proxy is not None:
        parts = urlsplit(values.http_proxy)
        if parts.scheme not in ("http", "https", "socks5") or not parts.hostname:
            raise ValueError(f"--http-proxy {values.http_proxy!r}: expected a proxy URL such as http://host:3128 "
                             "(http, https or socks5)")


def middleware_class(path: str) -> type:
    """The middleware class at dotted `path`, checked against `MIDDLEWARE_SIGNATURE`; ValueError
    (`PluginError`) naming the flag, the class and what to change."""
    from relax.utils.plugins import PluginError, check_signature, import_object

    cls: Any = import_object(path, flag=MIDDLEWARE_FLAG)
    if not inspect.isclass(cls):
        raise PluginError(f"{MIDDLEWARE_FLAG}: {path} is not a class; expected {MIDDLEWARE_SIGNATURE}")
    if any(base.__name__ == "BaseHTTPMiddleware" and base.__module__.startswith("starlette") for base in cls.__mro__):
        raise PluginError(f"{MIDDLEWARE_FLAG}: {path} is a Starlette middleware (slime's router is FastAPI); Relax's "
                          "router serves aiohttp: drop the BaseHTTPMiddleware base and take an aiohttp web.Request "
                          "(`await request.json()` as before; set request[JSON_BODY], from relax.engine.router.router, "
                          f"to change the body): {MIDDLEWARE_SIGNATURE}")
    check_signature(cls, flag=MIDDLEWARE_FLAG, positional=1, keywords=("router",), expected=MIDDLEWARE_SIGNATURE)
    if not inspect.iscoroutinefunction(getattr(cls, "dispatch", None)):
        raise PluginError(f"{MIDDLEWARE_FLAG}: {path} has no `async def dispatch(self, request, call_next)`; "
                          f"expected {MIDDLEWARE_SIGNATURE}")
    return cls
