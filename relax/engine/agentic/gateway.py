"""The agent gateway: an OpenAI-compatible server in the Rollout process through which black-box
agents call the policy, every call recorded token-in/token-out (docs/agents.md).

Routes (one session per episode, its id in the path, its own random key):

    POST /sessions/{id}/v1/chat/completions   messages, tools, tool_choice auto|none, stream false|true
    GET  /sessions/{id}/v1/models             the served model's name

Every request needs `Authorization: Bearer <the session's key>` (401 otherwise); an unknown or
closed session is a 404, a body over `MAX_BODY_BYTES` a 413, malformed JSON or a bad field a 400
naming it (gateway_protocol.py). A bad request is answered and logged, and the gateway serves on:
it never ends the run. A stream is the whole reply cut into OpenAI's chunks (the engine answers a
call at once), ending with `data: [DONE]`.

The server (uvicorn, FastAPI) runs on the rollout's event loop, started with the loop's first
episode (`gateway_for`), so sessions, calls and the episodes that read them share one loop and no
lock. It binds `--agent-gateway-host` (default 127.0.0.1: loopback only) on a free port; the key
travels to the agent function as an argument, never in argv, a URL or a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any, AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from relax.engine.agentic.gateway_protocol import MAX_BODY_BYTES, GatewayError, models_body, parse_chat
from relax.engine.agentic.gateway_session import RunContext, Session

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
KEEP_ALIVE_S = 120  # seconds an idle agent connection stays open (uvicorn's default, 5 s, races httpx's)
_GATEWAYS: dict[int, Gateway] = {}  # id(event loop) -> its gateway


class Gateway:
    """The server and its open sessions (module doc)."""

    def __init__(self, host: str = LOOPBACK) -> None:
        self.host = host
        self.port: int | None = None
        self.sessions: dict[str, Session] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.bad_requests = 0
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Serve on this loop (idempotent: concurrent callers wait for the one start)."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._start())
        await asyncio.shield(self._ready)

    async def _start(self) -> None:
        self.loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        # log_config None: the process's logging stays as the run configured it. Idle connections are
        # kept longer than clients keep them (httpx: 5 s), so a client never reuses one being closed.
        config = uvicorn.Config(build_app(self), log_config=None, log_level="warning", access_log=False,
                                lifespan="off", timeout_keep_alive=KEEP_ALIVE_S)
        self._server = _Server(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:  # startup is a few event-loop turns
            if self._task.done():
                self._task.result()  # raises the reason it could not serve
                raise RuntimeError("the agent gateway stopped while starting")
            await asyncio.sleep(0.005)
        logger.info("agent gateway on %s:%d", self.host, self.port)

    def serving(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self.loop is loop and self._task is not None and not self._task.done()

    async def stop(self) -> None:
        for session in self.sessions.values():
            session.closed = True
        self.sessions.clear()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait([self._task], timeout=10)

    # ---- sessions ----------------------------------------------------------------------
    def open(self, ctx: RunContext, params: dict[str, Any]) -> Session:
        session = Session(ctx=ctx, params=dict(params))
        self.sessions[session.id] = session
        return session

    def close(self, session: Session) -> None:
        session.closed = True
        self.sessions.pop(session.id, None)

    def base_url(self, session: Session) -> str:
        """What the agent's OpenAI client takes as `base_url`."""
        host = self.host
        if host in ("0.0.0.0", "::", ""):  # every interface: the agent reaches this node by its address
            host = socket.gethostbyname(socket.gethostname())
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/sessions/{session.id}/v1"

    def session(self, session_id: str, authorization: str | None) -> Session:
        """The open session `session_id` whose key the request carries (GatewayError 404 / 401)."""
        session = self.sessions.get(session_id)
        if session is None:
            raise GatewayError(404, f"no open session {session_id!r} (the episode ended, or a wrong base URL)")
        session.authorize(authorization)
        return session


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the run's signals belong to the process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def build_app(gateway: Gateway) -> FastAPI:
    """The FastAPI app of the routes (module doc)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def refuse(session_id: str, exc: GatewayError) -> JSONResponse:
        gateway.bad_requests += 1
        logger.warning("agent gateway: session %s: HTTP %d: %s", session_id[:12], exc.status, exc.message)
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat_completions(session_id: str, request: Request):
        try:
            session = gateway.session(session_id, request.headers.get("authorization"))
            call = parse_chat(await read_json(request))
            reply = await session.complete(call)
        except GatewayError as exc:
            return refuse(session_id, exc)
        if call.stream:
            return StreamingResponse(_events(reply.chunks(call.include_usage)), media_type="text/event-stream")
        return JSONResponse(reply.body())

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str, request: Request):
        try:
            session = gateway.session(session_id, request.headers.get("authorization"))
        except GatewayError as exc:
            return refuse(session_id, exc)
        return JSONResponse(models_body(session.ctx.model_name))

    return app


async def _events(chunks: list[str]) -> AsyncIterator[str]:
    for chunk in chunks:
        yield chunk


async def read_json(request: Request, limit: int = MAX_BODY_BYTES) -> Any:
    """The request's JSON body, read up to `limit` bytes (GatewayError 413 beyond, 400 if not JSON)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"body: {declared} bytes, the gateway takes at most {limit}", "body")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise GatewayError(413, f"body: over {limit} bytes, the gateway takes at most {limit}", "body")
    try:
        return json.loads(bytes(body))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GatewayError(400, f"body: not valid JSON ({exc})", "body") from None


async def gateway_for(host: str = LOOPBACK) -> Gateway:
    """The running loop's gateway, started on first use."""
    loop = asyncio.get_running_loop()
    gateway = _GATEWAYS.get(id(loop))
    if gateway is None or gateway.host != host or (gateway.loop is not None and not gateway.serving(loop)):
        gateway = _GATEWAYS[id(loop)] = Gateway(host)
    await gateway.start()
    return gateway


async def close_gateways() -> None:
    """Stop the running loop's gateway (the Rollout's shutdown; tests, before their loop ends)."""
    gateway = _GATEWAYS.pop(id(asyncio.get_running_loop()), None)
    if gateway is not None:
        await gateway.stop()
