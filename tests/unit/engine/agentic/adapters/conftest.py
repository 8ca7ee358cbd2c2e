"""Real servers for the adapter tests, started once per module, each in its own process: an
OpenEnv environment server (and one that dies at its second step) and an MCP server over
streamable HTTP. (Stdio MCP servers are started by the environments themselves, one per episode.)"""

from __future__ import annotations

import pytest
from adapter_services import mcp_http_server, openenv_server


@pytest.fixture(scope="module")
def openenv_servers():
    """(healthy, dies at step 2), started together."""
    servers = [openenv_server(), openenv_server(crash_at_step=2)]
    try:
        yield tuple(server.wait_ready() for server in servers)
    finally:
        for server in servers:
            server.kill()


@pytest.fixture(scope="module")
def mcp_http():
    server = mcp_http_server()
    try:
        yield server.wait_ready()
    finally:
        server.kill()
