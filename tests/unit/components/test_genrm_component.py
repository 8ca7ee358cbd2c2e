"""GenRM role: engine count and options from the flags, a router over the engines (its fleet), clean shutdown."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from relax.components.setup_context import SetupContext
from relax.backends import registry
from relax.components.genrm import GenRM
from relax.config.plan import resolve_plan
from relax.config.role_plans import needs_genrm
from relax.config.schema import RelaxConfig
from relax.utils.http_utils import close_sessions, post


class FakeEngine:
    def __init__(self, url):
        self.url, self.terminated, self.ready = url, False, False

    def wait_ready(self, timeout):
        self.ready = True

    def alive(self):
        return not self.terminated

    def terminate(self, timeout=10.0):
        self.terminated = True


LAUNCHED: list = []


def fake_launch(model_path, *, api_key=None, num_threads=None, log_path=None, options=None, device="cpu"):
    LAUNCHED.append({"model": model_path, "options": options, "api_key": api_key})
    engine = FakeEngine(URLS[len(LAUNCHED) - 1])
    ENGINES.append(engine)
    return engine


URLS: list[str] = []
ENGINES: list[FakeEngine] = []


async def start_judges(n):
    """n tiny HTTP 'engines' answering /generate with their own number."""
    runners = []
    for i in range(n):
        async def generate(request, i=i):
            body = await request.json()
            return web.json_response({"text": f"Score: {i}", "echo": body})

        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        URLS.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
        runners.append(runner)
    return runners


@pytest.fixture()
def cfg(tmp_path, monkeypatch):
    LAUNCHED.clear(), URLS.clear(), ENGINES.clear()
    monkeypatch.setitem(registry.INFERENCE_BACKENDS, "fake", f"{__name__}.fake_launch")
    return RelaxConfig().replace(
        rollout_backend="fake", exp_dir=str(tmp_path), genrm_model_path="/judge", genrm_num_gpus=4,
        genrm_num_gpus_per_engine=2, genrm_engine_config={"max_context_len": 64},
        resource={"actor": [1, 1], "rollout": [1, 1]}, rollout_batch_size=1)


def genrm(cfg: RelaxConfig) -> GenRM:
    return GenRM(cfg, resolve_plan(cfg).role("genrm"))


def test_engine_count_is_gpus_over_gpus_per_engine(cfg):
    assert resolve_plan(cfg).role("genrm").workers == 2 and needs_genrm(cfg)
    assert not needs_genrm(cfg.replace(genrm_model_path=None))


def test_setup_launches_the_judges_behind_a_router_and_shutdown_stops_them(cfg):
    async def main():
        runners = await start_judges(2)
        role = genrm(cfg)
        await role.start()
        info = await role.setup(SetupContext())
        replies = [await post(info.genrm_url + "/generate", {"text": "t", "sampling_params": {}})
                   for _ in range(4)]
        urls, stats = role.engine_urls(), await role.stats()
        await role.shutdown()
        await close_sessions()
        for runner in runners:
            await runner.cleanup()
        return urls, replies, stats

    urls, replies, stats = asyncio.run(main())
    assert [c["model"] for c in LAUNCHED] == ["/judge", "/judge"]
    assert all(c["options"] == {"max_context_len": 64} for c in LAUNCHED)
    assert urls == URLS and all(e.ready for e in ENGINES)
    assert sorted(r["text"] for r in replies) == ["Score: 0", "Score: 0", "Score: 1", "Score: 1"]  # both engines
    assert stats["genrm/requests"] == 4.0 and stats["genrm/engines_alive"] == 2.0
    assert all(e.terminated for e in ENGINES)


def test_a_bad_engine_option_names_the_flag(cfg):
    cfg = cfg.replace(rollout_backend="hf", genrm_engine_config={"bogus": 1})
    with pytest.raises(ValueError, match="--genrm-engine-config: .*unknown engine option 'bogus'"):
        asyncio.run(genrm(cfg).start())
