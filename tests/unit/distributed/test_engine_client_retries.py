"""EngineClient over a real socket whose server drops connections without a reply (what a
stalled engine or a closed keep-alive connection looks like to the client): idempotent control
calls are sent again and succeed; generation and weight-group calls are never repeated."""

from __future__ import annotations

import asyncio
import json

import pytest

from relax.distributed.engine_client import EngineClient, EngineError
from relax.utils.http_utils import IDEMPOTENT_PATHS
from relax.utils.net import CLIENT_KEEP_ALIVE_S, ENGINE_KEEP_ALIVE_S


async def _flaky_server(drops: int):
    """An HTTP/1.1 server that closes the first `drops` connections once a request arrived,
    then answers every request with {"success": true}. Returns (server, port, requests seen)."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            lines = head.decode().split("\r\n")
            length = next((int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")), 0)
            if length:
                await reader.readexactly(length)
            seen.append(lines[0].split()[1])
            if len(seen) <= drops:
                writer.close()
                return
            body = json.dumps({"success": True, "message": "ok"}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def _run(drops: int, call):
    async def main():
        server, port, seen = await _flaky_server(drops)
        try:
            async with EngineClient(f"http://127.0.0.1:{port}", timeout=5) as client:
                try:
                    return await call(client), seen
                except EngineError as err:
                    return err, seen
        finally:
            server.close()
    return asyncio.run(main())


def test_an_idempotent_call_whose_connection_broke_is_sent_again():
    reply, seen = _run(2, lambda c: c.release_memory_occupation())
    assert reply == {"success": True, "message": "ok"}
    assert seen == ["/release_memory_occupation"] * 3


def test_retries_are_bounded_and_the_error_says_how_many_attempts():
    err, seen = _run(10, lambda c: c.pause_generation())
    assert isinstance(err, EngineError) and err.status is None
    assert "(after 4 attempts)" in str(err) and len(seen) == 4


@pytest.mark.parametrize("call, path", [
    (lambda c: c.generate({"input_ids": [1]}), "/generate"),
    (lambda c: c.init_weights_update_group(master_address="127.0.0.1", master_port=1, rank_offset=1,
                                           world_size=2), "/init_weights_update_group"),
])
def test_generation_and_weight_group_calls_are_never_repeated(call, path):
    err, seen = _run(1, call)
    assert isinstance(err, EngineError) and "no reply" in str(err)
    assert seen == [path]


def test_the_client_drops_idle_connections_before_the_engine_does():
    assert CLIENT_KEEP_ALIVE_S < ENGINE_KEEP_ALIVE_S
    assert "/generate" not in IDEMPOTENT_PATHS and "/update_weights_from_distributed" not in IDEMPOTENT_PATHS
