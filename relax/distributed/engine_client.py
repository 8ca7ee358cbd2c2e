"""Async client for SGLang's native HTTP API: the one engine HTTP client of rollout, the engine
fleet and weight sync (`weights.endpoints.HTTPEndpoint` wraps it for the weight sender). It lives
in `distributed`, below engine/, backends/ and components/, so that all of them may import it.

Works unchanged against the `hf` engine and a real SGLang server: the paths, payload fields
and reply shapes are SGLang's (`/generate`, `/pause_generation`, `/init_weights_update_group`,
...). Every call has a timeout. A non-2xx reply, or a JSON reply with `"success": false`,
raises `EngineError` carrying the engine's message, the URL and the HTTP status, so callers
never mistake a rejected weight update for a successful one. An idempotent call whose connection
broke before a reply (an engine that was stalled, a dropped keep-alive connection) is sent again
(`http_utils.IDEMPOTENT_PATHS`); generation and weight-group calls never are.

The wire: calls go out through a pooled aiohttp session (`AioWire`), as the router's and
`http_utils.post`'s do. A control call's round trip is on a weight push's critical path (an armed
push makes two), and httpx spent ~1.3 ms more of the caller's CPU per call than aiohttp on this
project's 2-core CI machine (1.8-1.9 ms against 0.56-0.79 ms for a no-op POST to uvicorn).
`transport=` (an httpx transport: `MockTransport`, `ASGITransport`, a recording wrapper) sends the
calls through httpx instead (`HttpxWire`): tests put an engine in-process or a handler on the wire.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol, Sequence

import aiohttp
import httpx

from relax.utils.http_utils import IDEMPOTENT_PATHS, TRANSPORT_RETRIES, error_message
from relax.utils.net import CLIENT_KEEP_ALIVE_S

MAX_CONNECTIONS = 1024  # per engine: a rollout's burst of concurrent calls
JSON = {"Content-Type": "application/json"}


def encode_json(payload: Any) -> bytes:
    """A request body as httpx writes `json=`: compact, UTF-8, no NaN or infinity (not JSON)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class NoReply(Exception):
    """The wire got no reply: `broken` when the connection failed (an idempotent call may be sent
    again), else the call timed out or failed otherwise. `cause` is the library's exception."""

    def __init__(self, cause: BaseException, *, broken: bool, timed_out: bool = False) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause, self.broken, self.timed_out = cause, broken, timed_out


class Wire(Protocol):
    """One engine's HTTP transport: (status, body bytes) of a request, or NoReply."""

    async def send(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]: ...
    async def close(self) -> None: ...


class AioWire:
    """Calls over a pooled aiohttp session, made on the first call in the caller's event loop (a client
    used from another loop later gets a new one: a session's connections belong to its loop)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url, self.headers = url, headers
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=CLIENT_KEEP_ALIVE_S)
            self._session = aiohttp.ClientSession(self.url, headers=self.headers, connector=connector,
                                                  trust_env=False)
            self._loop = loop
        return self._session

    async def send(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        try:
            async with self._current().request(method, path, data=body, headers=JSON if body is not None else None,
                                               timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                return response.status, await response.read()
        except asyncio.TimeoutError as exc:
            raise NoReply(exc, broken=False, timed_out=True) from exc
        except aiohttp.ClientConnectionError as exc:  # refused, reset, or closed before the reply
            raise NoReply(exc, broken=True) from exc
        except aiohttp.ClientError as exc:
            raise NoReply(exc, broken=False) from exc

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:  # (a session of a loop that is gone has nothing left to close here)
                await session.close()


class HttpxWire:
    """Calls through an httpx transport (tests: an engine's ASGI app in-process, a mock handler)."""

    def __init__(self, url: str, headers: dict[str, str], transport: httpx.AsyncBaseTransport) -> None:
        self._client = httpx.AsyncClient(base_url=url, headers=headers, transport=transport)

    async def send(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        try:
            response = await self._client.request(method, path, content=body, headers=JSON if body is not None
                                                  else None, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise NoReply(exc, broken=False, timed_out=True) from exc
        except httpx.TransportError as exc:  # the connection broke: no reply came
            raise NoReply(exc, broken=True) from exc
        except httpx.HTTPError as exc:
            raise NoReply(exc, broken=False) from exc
        return response.status_code, response.content

    async def close(self) -> None:
        await self._client.aclose()


class EngineError(RuntimeError):
    """An engine call failed: `url`, `status` (None when no reply came), the engine's message and
    its reply's `body` (parsed JSON, text or None), which tells a refusal (`success: false`) apart."""

    def __init__(self, url: str, message: str, status: int | None = None, body: Any = None):
        self.url, self.status, self.message, self.body = url, status, message, body
        where = f"HTTP {status}" if status is not None else "no reply"
        super().__init__(f"{url}: {where}: {message}")

    def about(self, engine: str) -> EngineError:
        """This error with what is known of the engine's process appended (`EngineHandle.describe`)."""
        return EngineError(self.url, f"{self.message}\n{engine}", self.status, self.body)


class EngineClient:
    """One engine's HTTP API. Use as `async with EngineClient(url) as c:` or call `close()`."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0,
                 generate_timeout: float = 3600.0, transport: httpx.AsyncBaseTransport | None = None):
        """`transport`: an httpx transport to send through instead of the network (see the module doc)."""
        self.url = url.rstrip("/")
        self.timeout, self.generate_timeout = timeout, generate_timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._wire: Wire = AioWire(self.url, headers) if transport is None else HttpxWire(self.url, headers, transport)

    async def __aenter__(self) -> "EngineClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._wire.close()

    async def _call(self, method: str, path: str, payload: dict | None = None, timeout: float | None = None) -> Any:
        url = self.url + path
        retries = TRANSPORT_RETRIES if path in IDEMPOTENT_PATHS else 0
        timeout = timeout or self.timeout
        data = encode_json(payload) if payload is not None else None
        for attempt in range(retries + 1):
            try:
                status, content = await self._wire.send(method, path, data, timeout)
                break
            except NoReply as exc:
                if exc.timed_out:
                    raise EngineError(url, f"timed out after {timeout:.0f}s ({type(exc.cause).__name__})") from exc
                if not exc.broken or attempt == retries:
                    tried = f" (after {retries + 1} attempts)" if retries and exc.broken else ""
                    raise EngineError(url, f"{exc}{tried}") from exc
                await asyncio.sleep(0.2 * 2 ** attempt)
        body: Any = None
        if content:
            try:
                body = json.loads(content)
            except ValueError:
                body = content.decode(errors="replace")
        if status >= 400 or (isinstance(body, dict) and body.get("success") is False):
            raise EngineError(url, error_message(body), status, body)
        return body

    async def post(self, path: str, payload: dict | None = None, *, timeout: float | None = None) -> Any:
        """POST any SGLang endpoint (`path` from the base URL); the reply, or EngineError as above."""
        return await self._call("POST", path, payload, timeout)

    # ---- generation and health -------------------------------------------------------
    async def generate(self, payload: dict, *, timeout: float | None = None) -> Any:
        """POST /generate; returns the reply (a dict, or a list for a batched request)."""
        return await self._call("POST", "/generate", payload, timeout or self.generate_timeout)

    async def _probe(self, path: str, timeout: float) -> bool:
        try:
            await self._call("GET", path, timeout=timeout)
        except EngineError:
            return False
        return True

    async def health(self, *, timeout: float = 5.0) -> bool:
        """GET /health; False instead of raising when the engine is down."""
        return await self._probe("/health", timeout)

    async def health_generate(self, *, timeout: float = 30.0) -> bool:
        """GET /health_generate (the engine can generate a token); False instead of raising."""
        return await self._probe("/health_generate", timeout)

    async def get_model_info(self) -> dict:
        return await self._call("GET", "/model_info")

    async def get_server_info(self) -> dict:
        return await self._call("GET", "/server_info")

    async def get_weight_version(self) -> str | None:
        """The engine's weight version, from `/model_info` (SGLang has no `/get_weight_version`)."""
        return (await self.get_model_info()).get("weight_version")

    # ---- control ---------------------------------------------------------------------
    async def pause_generation(self, mode: str = "abort") -> Any:
        return await self._call("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> Any:
        return await self._call("POST", "/continue_generation", {})

    async def flush_cache(self) -> Any:
        return await self._call("POST", "/flush_cache")

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> Any:
        if rid is None and not abort_all:
            raise ValueError("abort_request needs rid=... or abort_all=True")
        payload: dict[str, Any] = {"abort_all": abort_all}
        if rid is not None:
            payload["rid"] = rid
        return await self._call("POST", "/abort_request", payload)

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> Any:
        return await self._call("POST", "/release_memory_occupation", {"tags": list(tags) if tags else None})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> Any:
        return await self._call("POST", "/resume_memory_occupation", {"tags": list(tags) if tags else None})

    # ---- weight sync -----------------------------------------------------------------
    async def init_weights_update_group(self, *, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str = "weight_update_group",
                                        backend: str = "nccl", timeout: float | None = None) -> Any:
        return await self._call("POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend,
        }, timeout)

    async def update_weights_from_distributed(self, *, names: Sequence[str], dtypes: Sequence[Any],
                                              shapes: Sequence[Sequence[int]], group_name: str = "weight_update_group",
                                              flush_cache: bool = False, weight_version: str | None = None,
                                              timeout: float | None = None) -> Any:
        """dtypes may be torch dtypes or SGLang names ('bfloat16'); shapes any int sequences."""
        payload: dict[str, Any] = {
            "names": list(names), "dtypes": [str(d).replace("torch.", "") for d in dtypes],
            "shapes": [[int(x) for x in s] for s in shapes], "group_name": group_name, "flush_cache": flush_cache,
        }
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return await self._call("POST", "/update_weights_from_distributed", payload, timeout)

    async def begin_weight_update(self) -> Any:
        """Open SGLang's weight-update session (updates load only inside one, SGLang >= 0.5.23)."""
        return await self._call("POST", "/begin_weight_update", {})

    async def end_weight_update(self) -> Any:
        """Close the session: SGLang finalizes the loaded weights."""
        return await self._call("POST", "/end_weight_update", {})

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> Any:
        return await self._call("POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> Any:
        return await self._call("POST", "/update_weight_version",
                                {"new_version": str(new_version), "abort_all_requests": abort_all_requests})
