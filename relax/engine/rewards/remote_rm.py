"""`remote_rm`: ask a reward service over HTTP.

POSTs `{"prompt", "response", "label", "metadata"}` as JSON to `url` (`--rm-url`). The reply
body must be a number or an object with a numeric `"score"`; the reward is that number as a
float. Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff
(`backoff`, 2x `backoff`, 4x ...) up to `max_retries` times; any other 4xx fails at once.
`timeout` is the budget in seconds for all attempts together (each attempt gets what is left).
`proxy` (`--http-proxy`): the requests go through that HTTP(S) proxy (the service is outside the run).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One shared TLS context: building it costs ~20 ms, a client reusing it ~1 ms."""
    return ssl.create_default_context()


class RemoteRewardError(RuntimeError):
    """The reward service answered with an error or an unreadable body."""


def parse_reply(body: Any, url: str) -> float:
    """The score in a reply body: a number, or {"score": number}."""
    if isinstance(body, dict) and "score" in body:
        body = body["score"]
    if isinstance(body, bool) or not isinstance(body, (int, float)):
        raise RemoteRewardError(f"remote_rm: {url} replied {body!r}; expected a number or {{\"score\": number}}")
    return float(body)


def _json_body(reply: httpx.Response, url: str) -> Any:
    try:
        return reply.json()
    except ValueError as exc:
        raise RemoteRewardError(f"remote_rm: {url} replied non-JSON {reply.text[:200]!r}") from exc


async def score(response: str, label: Any, metadata: dict | None = None, *, prompt: Any = "",
                url: str | None = None, timeout: float = 60.0, max_retries: int = 3,
                backoff: float = 0.5, proxy: str | None = None) -> float:
    """The score the service at `url` gives this response."""
    if not url:
        raise ValueError("remote_rm: no URL; pass --rm-url http://host:port/path")
    import httpx  # lazy: keeps `relax-reward` and worker start-up light

    payload = {"prompt": prompt, "response": response, "label": label, "metadata": metadata or {}}
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(verify=_ssl_context(), proxy=proxy) as client:
        for attempt in range(max_retries + 1):
            left = deadline - time.monotonic()
            try:
                reply = await client.post(url, json=payload, timeout=max(left, 0.001))
            except httpx.TransportError as exc:  # connection errors and timeouts
                error: str = f"{type(exc).__name__}: {exc}"
            else:
                if reply.status_code == 200:
                    return parse_reply(_json_body(reply, url), url)
                error = f"HTTP {reply.status_code}: {reply.text[:200]}"
                if reply.status_code not in RETRYABLE_STATUS:
                    raise RemoteRewardError(f"remote_rm: {url} {error}")
            delay = backoff * 2**attempt
            if attempt == max_retries or time.monotonic() + delay >= deadline:
                raise RemoteRewardError(f"remote_rm: {url} failed after {attempt + 1} attempt(s): {error}")
            logger.warning("remote_rm: attempt %d to %s failed (%s); retrying in %.2fs", attempt + 1, url, error, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
