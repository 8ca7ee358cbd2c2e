"""The scaling REST API over a `FleetScaler` (docs/elastic-scaling.md has curl examples):

    GET  /fleet                     engines (id, address, state, protected, external), operations
    POST /scale_out                 {"num_engines": n} | {"target_engines": n} | {"addresses": [...]}  -> 202
    POST /scale_in                  {"num_engines": n} | {"target_engines": n} | {"engines": [...]}    -> 202
    GET  /operations/{id}           an operation's status, phase and events
    POST /operations/{id}/cancel    cancel it, rolling the fleet back                                  -> 202

Every request, reads included, needs `Authorization: Bearer <token>` (401 otherwise; compared in
constant time). Answers are JSON; a refused request gets a 4xx whose `error` says what was wrong
(400 a bad body, 404 an unknown operation or path, 409 another operation runs — with its id — or an
engine is protected, 413 a body over 64 KiB, 422 an idempotency key reused for another request) and
never a traceback. A new operation is 202; a repeated idempotency key returns its operation with 200.
The server runs on the caller's event loop (aiohttp), bound to loopback unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any, Awaitable, Callable

from aiohttp import web

from relax.engine.elastic.operations import ScalingError
from relax.engine.elastic.requests import MAX_BODY_BYTES, idempotency_key, scale_in_request, scale_out_request
from relax.engine.elastic.scaler import FleetScaler

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ScalingApi:
    def __init__(self, scaler: FleetScaler, token: str, host: str = "127.0.0.1", port: int = 0,
                 extra: Callable[[], dict[str, Any]] | None = None) -> None:
        """`extra()`: more of the run's state for GET /fleet (the autoscaler's)."""
        self.scaler, self.host, self.port = scaler, host, port
        self._token = token.encode()
        self._extra = extra
        self._runner: web.AppRunner | None = None
        self.refused = 0  # requests answered with a 4xx

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._guard])
        app.router.add_get("/fleet", self._fleet)
        app.router.add_post("/scale_out", self._scale_out)
        app.router.add_post("/scale_in", self._scale_in)
        app.router.add_get("/operations/{op_id}", self._operation)
        app.router.add_post("/operations/{op_id}/cancel", self._cancel)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        logger.info("scaling API on %s (bearer token in the run directory's .relax/scale_token)", self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- every request -------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authentication first (before the path is even looked at), then errors as JSON."""
        try:
            self._authorize(request.headers.get("Authorization"))
            return await handler(request)
        except ScalingError as exc:
            return self._refuse(request, exc.status, exc.body())
        except web.HTTPException as exc:  # aiohttp's own: unknown path, wrong method, body too large
            message = {404: f"no endpoint {request.path} (see GET /fleet)",
                       405: f"{request.method} is not allowed on {request.path}",
                       413: f"body: larger than {MAX_BODY_BYTES} bytes"}.get(exc.status, exc.reason)
            return self._refuse(request, exc.status, {"error": message})
        except Exception as exc:  # noqa: BLE001 - a request never takes the API (or the run) down
            logger.warning("scaling API: %s %s failed", request.method, request.path, exc_info=True)
            return web.json_response({"error": f"internal error: {type(exc).__name__}: {exc}"}, status=500)

    def _authorize(self, header: str | None) -> None:
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ScalingError(401, "missing credentials: send Authorization: Bearer <token> (the token is in "
                               "<exp-dir>/.relax/scale_token)")
        if not secrets.compare_digest(given.strip().encode(), self._token):
            raise ScalingError(401, "wrong token for this run's scaling API")

    def _refuse(self, request: web.Request, status: int, body: dict[str, Any]) -> web.Response:
        self.refused += 1
        logger.info("scaling API: %s %s -> HTTP %d: %s", request.method, request.path, status, body.get("error"))
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return web.json_response(body, status=status, headers=headers)

    async def _body(self, request: web.Request) -> Any:
        declared = request.content_length
        if declared is not None and declared > MAX_BODY_BYTES:
            raise ScalingError(413, f"body: {declared} bytes, the API takes at most {MAX_BODY_BYTES}", field="body")
        raw = await request.read()
        try:
            return json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ScalingError(400, f"body: not valid JSON ({exc})", field="body") from None

    # ---- routes --------------------------------------------------------------------------------
    async def _fleet(self, request: web.Request) -> web.Response:
        status = await self.scaler.status()
        return web.json_response({"api": self.url, **status, **(self._extra() if self._extra else {})})

    async def _scale_out(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        parsed = scale_out_request(body)
        op, new = await self.scaler.scale_out(parsed, idempotency_key(body, request.headers.get("Idempotency-Key")))
        return web.json_response({"operation": op.view()}, status=202 if new else 200)

    async def _scale_in(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        parsed = scale_in_request(body)
        op, new = await self.scaler.scale_in(parsed, idempotency_key(body, request.headers.get("Idempotency-Key")))
        return web.json_response({"operation": op.view()}, status=202 if new else 200)

    async def _operation(self, request: web.Request) -> web.Response:
        return web.json_response({"operation": self.scaler.book.get(request.match_info["op_id"]).view()})

    async def _cancel(self, request: web.Request) -> web.Response:
        return web.json_response({"operation": self.scaler.cancel(request.match_info["op_id"]).view()}, status=202)
