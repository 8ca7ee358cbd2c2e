"""Small async HTTP helpers shared by rollout code and user plugins.

`post(url, payload)` is the call custom generate functions use to reach the router
(`from relax.utils.http_utils import post`). One pooled client per event loop; every call
has a timeout; a non-2xx reply raises `HTTPError` with the server's message.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

DEFAULT_TIMEOUT_S = 600.0
_clients: dict[int, httpx.AsyncClient] = {}


class HTTPError(RuntimeError):
    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"POST {url} -> HTTP {status}: {body[:500]}")
        self.url, self.status, self.body = url, status, body


def _client() -> httpx.AsyncClient:
    loop_id = id(asyncio.get_running_loop())
    client = _clients.get(loop_id)
    if client is None:
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        client = _clients[loop_id] = httpx.AsyncClient(limits=limits, timeout=DEFAULT_TIMEOUT_S, trust_env=False)
    return client


async def post(url: str, payload: dict[str, Any], *, timeout: float | None = None,
               headers: dict[str, str] | None = None) -> Any:
    resp = await _client().post(url, json=payload, headers=headers, timeout=timeout or DEFAULT_TIMEOUT_S)
    if resp.status_code >= 400:
        raise HTTPError(url, resp.status_code, resp.text)
    return resp.json()


async def get(url: str, *, timeout: float | None = None, headers: dict[str, str] | None = None) -> Any:
    resp = await _client().get(url, headers=headers, timeout=timeout or DEFAULT_TIMEOUT_S)
    if resp.status_code >= 400:
        raise HTTPError(url, resp.status_code, resp.text)
    return resp.json()
