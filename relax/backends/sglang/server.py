"""`python -m relax.backends.sglang.server <SGLang server args>`: SGLang's HTTP server, started
the way `python -m sglang.launch_server` starts it, with two things Relax needs first.

1. `die_with_parent()` before the slow imports, so an engine whose launcher dies goes with it.
2. `/server_info` without the API key: SGLang reports the resolved `ServerArgs` there, `api_key`
   and `admin_api_key` among them; `redact_server_info` replaces them by "<redacted>" in the
   HTTP server's copy of `build_server_info` (the only caller that publishes it).
3. The API key from the environment (`RELAX_SGLANG_API_KEY`, removed from the environment so
   SGLang's own child processes do not inherit it), set as `server_args.api_key`: passed as
   `--api-key` it would sit in argv, which every user of the machine can read.

The rest is SGLang's (0.5.23): `load_plugins()`, `prepare_server_args(argv)` (its own parser),
`run_server(server_args)` (resolves the arguments once and calls
`sglang.srt.entrypoints.http_server.launch_server`), and on the way out `kill_process_tree` of
this process's children (scheduler, detokenizer), as SGLang's entry point does.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from relax.backends.sglang.launcher import API_KEY_ENV
from relax.utils.proc import die_with_parent


SECRET_FIELDS = ("api_key", "admin_api_key")


def redacted(info: dict[str, Any]) -> dict[str, Any]:
    """`info` with every set secret field replaced by "<redacted>"."""
    return {k: ("<redacted>" if k in SECRET_FIELDS and v else v) for k, v in info.items()}


def redact_server_info() -> None:
    from sglang.srt.entrypoints import http_server

    build = http_server.build_server_info
    http_server.build_server_info = lambda *args, **kwargs: redacted(build(*args, **kwargs))


def main(argv: list[str] | None = None) -> None:
    die_with_parent()
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    redact_server_info()
    server_args = prepare_server_args(list(sys.argv[1:] if argv is None else argv))
    api_key = os.environ.pop(API_KEY_ENV, None)
    if api_key:
        server_args.api_key = api_key  # before resolution seals the record
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
