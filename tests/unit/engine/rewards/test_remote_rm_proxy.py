"""--http-proxy: the remote reward service (--rm-type remote_rm) is reached through the proxy, the way a
run behind a corporate proxy reaches a service outside it; without the flag the call goes direct."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from relax.config import ConfigError, parse_config
from relax.engine.rewards import RewardExecutor, remote_rm
from relax.engine.specs import RewardSpec
from relax.types import Sample

SERVICE = "http://reward-service.invalid/score"  # resolvable only by the proxy


class Proxy:
    """A forward proxy stand-in: records each request line's target and body, answers {"score": 0.75}."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                proxy.seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                data = json.dumps({"score": 0.75}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def proxy():
    p = Proxy()
    yield p
    p.close()


def test_remote_rm_goes_through_the_proxy(proxy):
    score = asyncio.run(remote_rm.score("resp", "lab", url=SERVICE, proxy=proxy.url, timeout=10))
    assert score == 0.75
    (target, body), = proxy.seen
    assert target == SERVICE and body["response"] == "resp"  # an absolute-form request: a proxy's


def test_the_run_s_reward_executor_uses_http_proxy(proxy):
    executor = RewardExecutor(RewardSpec(rm_type="remote_rm", rm_url=SERVICE, timeout=10, http_proxy=proxy.url))
    sample = Sample(index=0, prompt="p", response="r", label="l")
    try:
        asyncio.run(executor.score([sample]))
    finally:
        executor.close()
    assert sample.reward == 0.75 and [t for t, _ in proxy.seen] == [SERVICE]


def test_http_proxy_must_be_a_proxy_url(base):
    assert parse_config(base + ["--http-proxy", "http://proxy.corp:3128"]).router.http_proxy == "http://proxy.corp:3128"
    with pytest.raises(ConfigError, match="--http-proxy 'proxy.corp:3128': expected a proxy URL"):
        parse_config(base + ["--http-proxy", "proxy.corp:3128"])
