"""A small MCP server built with the `mcp` SDK's own server class, for the adapter tests:
`python mcp_tool_server.py stdio` or `python mcp_tool_server.py http PORT` (streamable HTTP at
http://127.0.0.1:PORT/mcp). Tools: add, tiny_image (a 2x2 PNG), hang (never answers), crash (the process dies)."""

from __future__ import annotations

import io
import os
import sys

import anyio
from mcp.server.mcpserver import Image, MCPServer

server = MCPServer("relax-test-tools", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def tiny_image(colour: str = "red") -> Image:
    """A 2x2 image of one colour."""
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    PILImage.new("RGB", (2, 2), colour).save(buffer, format="PNG")
    return Image(data=buffer.getvalue(), format="png")


@server.tool()
async def hang() -> str:
    """Never answers."""
    await anyio.Event().wait()
    return "never"


@server.tool()
def crash() -> str:
    """The server process dies mid-call."""
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
