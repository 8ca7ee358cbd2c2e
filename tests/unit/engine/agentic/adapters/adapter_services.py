"""The adapter tests' servers, each a real process of its package's own server class, and the
environment factories the built-in rollout loads (`adapter_services.build_mcp_env`, ...)."""

from __future__ import annotations

import copy
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from relax.utils.net import free_port

# openenv-core's package root imports its Gradio web UI when gradio is installed: seconds of import
# time that neither these clients nor the test servers use. Imported once with gradio hidden (the
# package then leaves its web UI out), gradio importable again afterwards.
_HIDE_GRADIO = "gradio" not in sys.modules
if _HIDE_GRADIO:
    sys.modules["gradio"] = None  # type: ignore[assignment]
try:
    from relax.engine.agentic.adapters.mcp import MCPToolEnv
    from relax.engine.agentic.adapters.openenv import OpenEnvEnv
finally:
    if _HIDE_GRADIO:
        del sys.modules["gradio"]

HERE = Path(__file__).parent
MCP_STDIO = [sys.executable, str(HERE / "mcp_tool_server.py"), "stdio"]


class ServerProcess:
    """`python <script> *args` ("{port}" in them: a free port) serving on 127.0.0.1 until `kill()`."""

    def __init__(self, script: str, *args: Any, path: str = "") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{path}"
        argv = [str(a).format(port=self.port) for a in args]
        self.proc = subprocess.Popen([sys.executable, str(HERE / script), *argv])

    def wait_ready(self, timeout: float = 60.0) -> ServerProcess:
        """Until the port accepts connections (or the process has died: an error naming it)."""
        for _ in range(int(timeout / 0.05)):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                try:
                    code = self.proc.wait(timeout=0.05)  # the poll interval; returns at once if it died
                except subprocess.TimeoutExpired:
                    continue
                raise RuntimeError(f"{self.proc.args} exited with {code} before serving")
        raise RuntimeError(f"{self.proc.args} did not serve within {timeout} s")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def openenv_server(crash_at_step: int = 0) -> ServerProcess:
    return ServerProcess("openenv_word_server.py", "{port}", crash_at_step)


def mcp_http_server() -> ServerProcess:
    return ServerProcess("mcp_tool_server.py", "http", "{port}", path="/mcp")


def build_mcp_env(sample: Any = None, args: Any = None, **_: Any) -> MCPToolEnv:
    """The row's MCP server: streamable HTTP at metadata["mcp_url"], else a stdio server of its own."""
    url = sample.metadata.get("mcp_url")
    return MCPToolEnv(url=url) if url else MCPToolEnv(command=MCP_STDIO)


def build_openenv_env(sample: Any = None, args: Any = None, **_: Any) -> OpenEnvEnv:
    return OpenEnvEnv(sample.metadata["openenv_url"], reset_kwargs={"seed": sample.index})


def scripted_turns(tokenizer: Any, script: dict[tuple[int, ...], list[str]]) -> Any:
    """A `Traffic.rewrite` answering the k-th request of the sample whose prompt ids are a key with
    the k-th text of its script (then <|im_end|>), as if the engine had generated it: a random
    tiny model never writes a tool call."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = {key: 0 for key in script}

    def rewrite(payload: dict, reply: dict, index: int) -> dict:
        key = max((k for k in script if tuple(payload["input_ids"][:len(k)]) == k), key=len)
        text = script[key][turns[key]]
        turns[key] += 1
        reply = copy.deepcopy(reply)
        ids = tokenizer.encode(text, add_special_tokens=False) + [im_end]
        reply["meta_info"]["output_token_logprobs"] = [[-1.0, t, None] for t in ids]
        reply["meta_info"]["finish_reason"] = {"type": "stop"}
        return reply

    return rewrite
