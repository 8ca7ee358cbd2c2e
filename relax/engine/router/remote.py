"""Routers outside this process: sglang-router launched by a fleet, or a router already running at
`--sglang-router-ip`/`--sglang-router-port`.

Both are driven through sglang-router's worker API. `POST /workers {"url", "api_key"}` registers an
engine (the run's key travels in the body, never on a command line or in a URL an access log keeps);
registration is queued, so `add_engine` waits until `GET /workers` lists the engine healthy.
`DELETE /workers/{worker_id}` removes it. Routers older than sglang-router 0.3 take
`POST /add_worker?url=` / `POST /remove_worker?url=` instead (without a key: such an engine must
accept unauthenticated requests). A router with neither API (not sglang-router) must already know
the engines: registration logs that once and goes on.

The launched sglang-router (`python -m sglang_router.launch_router`) listens on loopback, its
Prometheus exporter too (which it opens on 0.0.0.0:29000 unless told), writes a log file, and gets
the parent-death signal the engines get, so it never outlives the process that started it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp

from relax.utils.net import free_port
from relax.utils.proc import die_with_parent, log_tail, process_state

logger = logging.getLogger(__name__)

PARENT_PID_ENV = "RELAX_ROUTER_PARENT_PID"
REGISTER_TIMEOUT_S = 60.0


def sglang_router_installed() -> bool:
    """The default router is sglang-router when its package is importable, else the built-in one."""
    return importlib.util.find_spec("sglang_router") is not None


class RemoteRouter:
    """A router reached over HTTP at `url`; `process`: the sglang-router process this fleet launched
    (stopped with the fleet), None for a router someone else runs (never stopped here)."""

    def __init__(self, url: str, *, api_key: str | None = None, process: subprocess.Popen | None = None,
                 log_path: str | None = None, timeout_s: float = REGISTER_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.engine_urls: list[str] = []  # engines registered by this fleet
        self.process, self.log_path, self.timeout_s = process, log_path, timeout_s
        self._api_key = api_key
        self._ids: dict[str, str | None] = {}  # engine URL -> sglang-router's worker id (None: legacy API)
        self._session: aiohttp.ClientSession | None = None
        self._warned = False

    def describe(self) -> str:
        if self.process is None:
            return f"the router at {self.url} (--sglang-router-ip/--sglang-router-port, not started by Relax)"
        return (f"sglang-router pid {self.process.pid} at {self.url} {process_state(self.process)}; log "
                f"{self.log_path}, ending:\n{log_tail(self.log_path or '', 2000).rstrip()}")

    async def _call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        assert self._session is not None, "start() the router first"
        async with self._session.request(method, self.url + path, **kwargs) as resp:
            body = await resp.read()
            try:
                return resp.status, await resp.json(content_type=None) if body else None
            except ValueError:
                return resp.status, body.decode(errors="replace")

    async def start(self) -> None:
        """Wait until the router answers GET /health (a launched one that exits first raises with its log)."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), trust_env=False)
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"router did not start: {self.describe()}")
            try:
                if (await self._call("GET", "/health"))[0] == 200:
                    return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no router answers GET {self.url}/health after {self.timeout_s:.0f}s: "
                                   f"{self.describe()}; start it first, or check the address")
            await asyncio.sleep(0.2)

    async def add_engine(self, url: str) -> None:
        """Register `url` and wait until the router routes to it."""
        body: dict[str, Any] = {"url": url} | ({"api_key": self._api_key} if self._api_key else {})
        status, reply = await self._call("POST", "/workers", json=body)
        legacy = status in (404, 405)
        if legacy:  # sglang-router < 0.3
            status, reply = await self._call("POST", "/add_worker", params={"url": url})
            if status in (404, 405):
                self._not_sglang_router(url)
                return
        if status >= 300:
            raise RuntimeError(f"{self.describe()} refused to register engine {url}: HTTP {status}: {reply}")
        self._ids[url] = None if legacy or not isinstance(reply, dict) else reply.get("worker_id")
        if not legacy:
            await self._wait_listed(url)  # registration is queued
        self.engine_urls.append(url)

    def _not_sglang_router(self, url: str) -> None:
        log = logger.debug if self._warned else logger.warning
        self._warned = True
        log("%s has no worker API (POST /workers or /add_worker): it is not sglang-router, so it must already "
            "route to the engines (%s not registered)", self.url, url)

    async def _wait_listed(self, url: str, present: bool = True) -> None:
        """Until GET /workers lists `url` healthy (`present`) or no longer lists it."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            status, reply = await self._call("GET", "/workers")
            workers = reply.get("workers", []) if status == 200 and isinstance(reply, dict) else []
            if present == any(w.get("url") == url and (w.get("is_healthy", True) or not present) for w in workers):
                return
            await asyncio.sleep(0.1)
        state = "list engine {url} as healthy" if present else "drop engine {url}"
        raise RuntimeError(f"{self.describe()} did not {state.format(url=url)} within {self.timeout_s:.0f}s")

    async def remove_engine(self, url: str) -> None:
        """Stop routing to `url` (an engine this fleet registered; others are left as they are)."""
        if url not in self.engine_urls:
            return
        self.engine_urls.remove(url)
        worker_id = self._ids.pop(url, None)
        if worker_id is not None:
            status, reply = await self._call("DELETE", f"/workers/{worker_id}")
            if status < 300:
                await self._wait_listed(url, present=False)  # removal is queued
        else:
            status, reply = await self._call("POST", "/remove_worker", params={"url": url})
        if status >= 300:
            logger.warning("%s did not remove engine %s: HTTP %s: %s", self.url, url, status, reply)

    async def stop(self) -> None:
        """A launched router is stopped; a running one only forgets the engines this fleet registered."""
        try:
            if self.process is None and self._session is not None:
                for url in list(self.engine_urls):
                    await self.remove_engine(url)
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None
            if self.process is not None and self.process.poll() is None:
                self.process.terminate()
                try:
                    await asyncio.to_thread(self.process.wait, 10)
                except subprocess.TimeoutExpired:
                    self.process.kill()


def launch_sglang_router(log_path: str, *, timeout_s: float, api_key: str | None) -> RemoteRouter:
    """Start sglang-router on a free loopback port with no engines (they register as they join)."""
    host = "127.0.0.1"
    port, metrics_port = free_port(host), free_port(host)
    cmd = [sys.executable, "-m", __name__, "--host", host, "--port", str(port), "--prometheus-host", host,
           "--prometheus-port", str(metrics_port), "--request-timeout-secs", str(max(1, int(timeout_s)))]
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    logger.info("sglang-router pid %d on http://%s:%d, log %s", process.pid, host, port, log_path)
    return RemoteRouter(f"http://{host}:{port}", api_key=api_key, process=process, log_path=log_path)


def main() -> None:
    """The launched router's process: die with the launching process, then run sglang-router's CLI."""
    import runpy

    die_with_parent(PARENT_PID_ENV)
    runpy.run_module("sglang_router.launch_router", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
