"""Small async HTTP helpers shared by rollout code and user plugins.

`post(url, payload)` is the call custom generate functions use to reach the router
(`from relax.utils.http_utils import post`). One pooled aiohttp session per event loop (aiohttp
gets a burst of hundreds of concurrent requests onto the wire several times faster than httpx
here, which matters because the engines batch whatever has arrived); every call has a
timeout; a non-2xx reply raises `HTTPError` with the server's message.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

DEFAULT_TIMEOUT_S = 600.0
# SGLang calls that leave an engine in the same state when repeated: one whose connection broke
# before a reply (an engine that stalled, a dropped idle keep-alive connection) is sent again.
# Generation and weight-group calls are never repeated (a collective must not run twice).
IDEMPOTENT_PATHS = frozenset({
    "/health", "/health_generate", "/get_model_info", "/get_server_info", "/get_weight_version",
    "/model_info", "/server_info",
    "/pause_generation", "/continue_generation", "/flush_cache", "/abort_request",
    "/release_memory_occupation", "/resume_memory_occupation", "/update_weight_version",
})
TRANSPORT_RETRIES = 3  # attempts after the first, for an idempotent call whose connection broke
_sessions: dict[int, aiohttp.ClientSession] = {}


def error_message(body: Any) -> str:
    """The human part of an error body: SGLang's {"error": {"message"}}, {"message"} or FastAPI's {"detail"}."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if key in body:
                return str(body[key])
    return str(body)


def clip(text: str, limit: int = 4000) -> str:
    """`text` cut to about `limit` characters, keeping its start and its end (a log tail's end)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 3]}\n[... {len(text) - limit} characters ...]\n{text[-(limit - limit // 3):]}"


class HTTPError(RuntimeError):
    def __init__(self, url: str, status: int, body: str) -> None:
        try:
            text = error_message(json.loads(body))  # the server's message, with its line breaks
        except ValueError:
            text = body
        super().__init__(f"{url} -> HTTP {status}: {clip(text)}")
        self.url, self.status, self.body = url, status, body


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _sessions.get(id(loop))
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
        session = _sessions[id(loop)] = aiohttp.ClientSession(connector=connector, trust_env=False)
    return session


async def _request(method: str, url: str, payload: dict[str, Any] | None, timeout: float | None,
                   headers: dict[str, str] | None) -> Any:
    client_timeout = aiohttp.ClientTimeout(total=timeout or DEFAULT_TIMEOUT_S)
    async with _session().request(method, url, json=payload, headers=headers, timeout=client_timeout) as resp:
        body = await resp.read()
        if resp.status >= 400:
            raise HTTPError(url, resp.status, body.decode(errors="replace"))
        return await resp.json(content_type=None)


async def post(url: str, payload: dict[str, Any], *, timeout: float | None = None,
               headers: dict[str, str] | None = None) -> Any:
    return await _request("POST", url, payload, timeout, headers)


async def get(url: str, *, timeout: float | None = None, headers: dict[str, str] | None = None) -> Any:
    return await _request("GET", url, None, timeout, headers)


async def close_sessions() -> None:
    """Close this loop's session (call before the loop ends to avoid 'unclosed session' warnings)."""
    session = _sessions.pop(id(asyncio.get_running_loop()), None)
    if session is not None:
        await session.close()
