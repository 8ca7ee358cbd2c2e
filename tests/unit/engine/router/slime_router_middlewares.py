"""SlimeRouter middlewares for tests/unit/engine/router/test_slime_router.py (and broken ones the
config must refuse)."""

from __future__ import annotations

from starlette.middleware.base import BaseHTTPMiddleware

from relax.engine.router.router import JSON_BODY

ORDER: list[str] = []


class CapTokens:
    """Caps every /generate at 2 new tokens (a changed body, handed on as request[JSON_BODY]) and tags
    every reply with how many engines the router routes to."""

    def __init__(self, app, *, router):
        self.router = router

    async def dispatch(self, request, call_next):
        ORDER.append(f"cap {request.method} {request.path}")
        if request.path == "/generate":
            body = await request.json()
            capped = {**body.get("sampling_params", {}), "max_new_tokens": 2}
            request[JSON_BODY] = {**body, "sampling_params": capped}
        response = await call_next(request)
        response.headers["X-Engines"] = str(len(self.router.engine_urls))
        return response


class Outer:
    def __init__(self, app, *, router):
        pass

    async def dispatch(self, request, call_next):
        ORDER.append("outer")
        return await call_next(request)


class SyncDispatch:
    def __init__(self, app, *, router):
        pass

    def dispatch(self, request, call_next):
        return call_next(request)


class NoRouterKeyword:
    def __init__(self, app):
        pass

    async def dispatch(self, request, call_next):
        return await call_next(request)


class StarletteMiddleware(BaseHTTPMiddleware):  # slime's kind: FastAPI's
    async def dispatch(self, request, call_next):
        return await call_next(request)
