"""External engines and routers with real `hf` engines: an engine started outside the fleet joins it,
serves through its router, receives weights (also when it listens on a non-loopback address, so the
weight-update group must bind one it can reach) and is never stopped by the fleet; a router that is
not sglang-router is used as it is; sglang-router (where installed) is launched and stopped by the
fleet, takes the engines the fleet launches, and refuses the per-item batch form the default
rollout sends (why it is not the default router).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import httpx
import psutil
import pytest

from relax.backends.hf.launcher import launch_hf_engine
from relax.backends.hf.tiny_model import build_tiny_qwen3
from relax.distributed.store import is_loopback
from relax.distributed.weights.sender import WeightSender
from relax.engine.fleet import EngineFleet, ExternalEngine, FleetSpec
from relax.engine.router.remote import RemoteRouter, launch_sglang_router, sglang_router_installed
from relax.utils.http_utils import HTTPError, close_sessions, post
from relax.utils.net import free_port

KEY = "external-key"
GREEDY = {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True}}


def lan_address() -> str:
    """A non-loopback IPv4 address of this machine (the external engine listens there), else loopback."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not is_loopback(a.address):
                return a.address
    return "127.0.0.1"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("external-model"), seed=0)


@pytest.fixture(scope="module")
def external(model_dir, tmp_path_factory):
    """An hf engine started by someone else (this fixture), on this machine's network address."""
    handle = launch_hf_engine(str(model_dir), host=lan_address(), api_key=KEY, num_threads=1,
                              log_path=str(tmp_path_factory.mktemp("external-logs") / "external.log"))
    try:
        handle.wait_ready(120)
        yield handle
    finally:
        handle.terminate()


@pytest.fixture()
def spec(model_dir, tmp_path, external):
    return FleetSpec(name="rollout", backend="hf", model_path=str(model_dir), api_key=KEY, log_dir=str(tmp_path),
                     external=(external.url,), startup_timeout=120)


def test_an_external_engine_serves_through_the_fleet_and_survives_its_stop(spec, external):
    async def main():
        fleet = EngineFleet(spec)
        await fleet.start(0)
        reply = await post(fleet.router_url + "/generate", GREEDY)
        described = fleet.describe(external.url)
        await fleet.stop()
        await close_sessions()
        return reply, described

    reply, described = asyncio.run(main())
    assert len(reply["output_ids"]) == 3
    assert described.startswith(f"external engine at {external.url} (not launched by Relax)")
    assert external.alive() and httpx.get(external.url + "/health").status_code == 200


def test_launched_and_external_engines_share_the_router_and_only_the_launched_one_is_stopped(spec, external):
    async def main():
        fleet = EngineFleet(spec)
        await fleet.start(1)
        launched = next(e for e in fleet.engines if not isinstance(e, ExternalEngine))
        urls = fleet.urls
        await fleet.remove(external.url)  # leaves the fleet, keeps running
        after_remove = fleet.urls
        await fleet.stop()
        return urls, after_remove, launched

    urls, after_remove, launched = asyncio.run(main())
    assert urls == [external.url, launched.url] and after_remove == [launched.url]
    assert not launched.alive() and external.alive()


def test_weights_pushed_to_the_fleet_reach_the_external_engine(spec, external, model_dir):
    """The trainer's weight group listens on loopback by default; the external engine listens on the
    machine's network address, so the group binds the address that reaches it."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()

    async def main():
        fleet = EngineFleet(spec)
        await fleet.start(0)
        sender = WeightSender(fleet.urls, api_key=KEY, backend="gloo", bucket_bytes=16 * 1024, timeout_s=60)
        try:
            await sender.connect()
            await sender.push(state.items(), version=5)
            return await fleet.weight_version(), sender.master_address
        finally:
            await sender.close()
            await fleet.stop()

    version, master = asyncio.run(main())
    assert version == 5
    assert is_loopback(master) == is_loopback(external.url.split("//")[1].rsplit(":", 1)[0])


def test_an_unreachable_external_engine_is_named():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=f"external engine at {url} is not healthy after 1s"):
        ExternalEngine(url).wait_ready(1)


def test_an_external_engine_that_refuses_the_runs_key_fails_at_start(external):
    with pytest.raises(RuntimeError, match="refuses the run's API key \\(HTTP 401\\)"):
        ExternalEngine(external.url, api_key="another-key").wait_ready(10)


def test_a_running_router_that_is_not_sglang_router_is_used_as_it_is(spec, external, caplog):
    """The built-in router of one fleet stands for a router someone runs: the second fleet sends its
    requests there and starts none; registering an engine with it (no worker API) only logs."""
    async def main():
        first = EngineFleet(spec)
        await first.start(0)
        second = EngineFleet(dataclasses.replace(spec, router=first.router_url))
        await second.start(0)
        reply = await post(second.router_url + "/generate", GREEDY)
        await second.router.add_engine("http://127.0.0.1:1")
        same = second.router_url == first.router_url
        await second.stop()
        still = await post(first.router_url + "/generate", GREEDY)  # the running router was left alone
        await first.stop()
        await close_sessions()
        return reply, same, still

    reply, same, still = asyncio.run(main())
    assert same and len(reply["output_ids"]) == len(still["output_ids"]) == 3
    assert "it is not sglang-router, so it must already route to the engines" in caplog.text


@pytest.mark.skipif(not sglang_router_installed(), reason="sglang-router is not installed")
def test_a_launched_sglang_router_routes_and_stops_with_the_fleet(spec, external):
    per_item = {"input_ids": [[5, 6], [7, 8]], "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 2}]}

    async def main():
        fleet = EngineFleet(dataclasses.replace(spec, sglang_router=True))
        await fleet.start(0)
        router = fleet.router
        reply = await post(fleet.router_url + "/generate", GREEDY)
        with pytest.raises(HTTPError, match="HTTP 422"):  # the default rollout's batch form
            await post(fleet.router_url + "/generate", per_item)
        await fleet.stop()
        await close_sessions()
        return router, reply

    router, reply = asyncio.run(main())
    assert isinstance(router, RemoteRouter) and router.process is not None
    assert len(reply["output_ids"]) == 3 and router.process.poll() is not None and external.alive()


@pytest.mark.skipif(not sglang_router_installed(), reason="sglang-router is not installed")
def test_engines_the_fleet_launches_are_registered_with_a_running_sglang_router(spec, tmp_path):
    async def main():
        running = launch_sglang_router(str(tmp_path / "router.log"), timeout_s=60, api_key=None)
        await running.start()
        try:
            fleet = EngineFleet(dataclasses.replace(spec, external=(), router=running.url))
            await fleet.start(1)
            listed = await running._call("GET", "/workers")
            reply = await post(running.url + "/generate", GREEDY)
            await fleet.stop()
            after = await running._call("GET", "/workers")
            return listed, reply, after
        finally:
            await running.stop()
            await close_sessions()

    (_, listed), reply, (_, after) = asyncio.run(main())
    assert len(listed["workers"]) == 1 and len(reply["output_ids"]) == 3
    assert after["workers"] == [] or all(w["url"] != listed["workers"][0]["url"] for w in after["workers"])


@pytest.mark.skipif(sglang_router_installed(), reason="sglang-router is installed")
def test_asking_for_sglang_router_without_it_says_what_to_install(spec):
    with pytest.raises(RuntimeError, match=r"sglang-router is not installed \(pip install sglang-router\)"):
        asyncio.run(EngineFleet(dataclasses.replace(spec, sglang_router=True)).start(0))
