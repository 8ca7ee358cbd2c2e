"""In-process engines for the scaling tests: small aiohttp servers speaking the SGLang endpoints the fleet
and the scaler call (/generate, /health, /model_info, /update_weight_version, /abort_request), handed
out by a launch function registered as the inference backend "fake" (a stand-in for `hf`). Each can
hang its /generate replies (until aborted), start slowly (until released) or fail to start."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import dataclass, field

from aiohttp import web

from relax.backends import registry
from relax.engine.fleet import EngineFleet, FleetSpec


@dataclass
class Behaviour:
    name: str
    version: int = 0
    fail_start: bool = False  # wait_ready raises (the process "exited")
    slow_start: threading.Event | None = None  # wait_ready blocks until set (or terminated)
    hang: bool = False  # /generate replies only when aborted
    served: list = field(default_factory=list)  # generate payloads answered
    aborted: int = 0


class FakeHandle:
    def __init__(self, url: str, b: Behaviour) -> None:
        self.url, self.b, self.terminated = url, b, False

    def wait_ready(self, timeout: float) -> None:
        if self.b.slow_start is not None and not self.b.slow_start.wait(timeout):
            raise TimeoutError(f"fake engine {self.b.name} not healthy after {timeout:g}s")
        if self.b.fail_start or self.terminated:
            raise RuntimeError(f"fake engine {self.b.name} exited with code 1 before becoming ready")

    def alive(self) -> bool:
        return not self.terminated

    def terminate(self, timeout: float = 10.0) -> None:
        self.terminated = True
        if self.b.slow_start is not None:
            self.b.slow_start.set()

    def describe(self) -> str:
        return f"fake engine {self.b.name} at {self.url}"


class Pool:
    """The engines the next launches get, in order, and everything launched so far."""

    current: "Pool | None" = None

    def __init__(self) -> None:
        self.ready: list[tuple[str, Behaviour]] = []
        self.launched: list[FakeHandle] = []
        self.runners: list[web.AppRunner] = []
        self.aborts: list[asyncio.Event] = []  # set on close: no handler hangs the servers' cleanup

    async def serve(self, b: Behaviour, *, queue: bool = True) -> str:
        """Start `b`'s server; queued, the next launch hands it out (else it is 'external')."""
        abort = asyncio.Event()
        self.aborts.append(abort)

        async def generate(request):
            payload = await request.json()
            if b.hang:
                await abort.wait()
                return web.json_response({"text": b.name, "meta_info": {"finish_reason": {"type": "abort"}}})
            b.served.append(payload)
            return web.json_response({"text": b.name, "meta_info": {"finish_reason": {"type": "stop"},
                                                                    "weight_version": str(b.version)}})

        async def update_version(request):
            b.version = int((await request.json())["new_version"])
            return web.json_response({"success": True})

        async def abort_request(request):
            b.aborted += 1
            abort.set()
            return web.json_response({"success": True})

        async def ok(request):
            return web.json_response({"success": True})

        async def healthy(request):
            return web.Response()

        async def model_info(request):
            return web.json_response({"weight_version": str(b.version)})

        async def server_info(request):
            return web.json_response({"busy_seconds": 0.0})

        app = web.Application()
        app.router.add_post("/generate", generate)
        app.router.add_get("/health", healthy)
        app.router.add_get("/model_info", model_info)
        app.router.add_get("/server_info", server_info)
        app.router.add_post("/update_weight_version", update_version)
        app.router.add_post("/abort_request", abort_request)
        app.router.add_post("/flush_cache", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        if queue:
            self.ready.append((url, b))
        return url

    async def close(self) -> None:
        for abort in self.aborts:
            abort.set()
        for runner in self.runners:
            await runner.cleanup()


def fake_launch(model_path, *, api_key=None, num_threads=None, log_path=None, options=None, device="cpu"):
    pool = Pool.current
    assert pool is not None and pool.ready, "no fake engine queued for this launch"
    url, b = pool.ready.pop(0)
    handle = FakeHandle(url, b)
    pool.launched.append(handle)
    return handle


def install(monkeypatch, tmp_path) -> tuple[Pool, FleetSpec]:
    """Register the fake backend; a fresh pool and the spec of a fleet over it."""
    monkeypatch.setitem(registry.INFERENCE_BACKENDS, "fake", f"{__name__}.fake_launch")
    Pool.current = Pool()
    return Pool.current, FleetSpec(name="rollout", backend="fake", model_path="/m", log_dir=str(tmp_path))


async def started_fleet(pool: Pool, spec: FleetSpec, versions: list[int], **changes) -> EngineFleet:
    """A fleet of len(versions) protected startup engines at those weight versions."""
    for i, v in enumerate(versions):
        await pool.serve(Behaviour(f"start{i}", version=v))
    fleet = EngineFleet(dataclasses.replace(spec, **changes) if changes else spec)
    await fleet.start(len(versions))
    return fleet


def run(pool: Pool, main) -> object:
    """`asyncio.run(main())`, then the HTTP sessions and the fake engines closed whatever happened."""
    from relax.utils.http_utils import close_sessions

    async def wrapped():
        try:
            return await main()
        finally:
            await close_sessions()
            await pool.close()
    return asyncio.run(wrapped())
