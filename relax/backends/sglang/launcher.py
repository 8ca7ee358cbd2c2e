"""Start an SGLang server as a child process that dies with its parent.

`launch_sglang_engine(model_path, ...)` runs `python -m relax.backends.sglang.server` (SGLang's
own server, see that module) on the GPUs named by `device` ("cuda:2,3": the child sees only GPUs
2 and 3, as CUDA_VISIBLE_DEVICES, and runs tensor parallel over both), with every engine option
passed to SGLang as `--<option>` (`relax.backends.sglang.args`) and the output going to a log
file. The run's API key travels by environment (argv is world-readable in /proc). The command and
its environment are built by a pure function, `engine_command`, so they can be checked without
a GPU.

Lifecycle as for the hf engine, and for the same reasons: the server's first act is
`die_with_parent` (`PR_SET_PDEATHSIG=SIGKILL`; it fires when the launching *thread* exits, so
launch from a long-lived thread), SGLang's scheduler and detokenizer processes die with the server
the same way (they set that signal themselves), and no `preexec_fn` is used (in a Ray process gRPC's fork handlers can
abort a child between fork and exec). `wait_ready` polls `GET /health`, which SGLang answers 503
until its warm-up request has run and 200 after (no API key needed); `terminate` sends SIGTERM
(SGLang shuts down its children) and SIGKILL after the timeout.

Backends never import one another (ARCHITECTURE.md §3): what both launchers need
(`die_with_parent`, the process description in error messages) lives in `relax.utils.proc`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence


from relax.backends.sglang.args import sglang_available, server_argv
from relax.backends.sglang.routing import check_options as check_routed_experts
from relax.utils.net import free_port
from relax.utils.proc import PARENT_PID_ENV, ChildServer

logger = logging.getLogger(__name__)

API_KEY_ENV = "RELAX_SGLANG_API_KEY"  # read (and removed from the environment) by the server module
_REPO_ROOT = str(Path(__file__).resolve().parents[3])



class SGLangEngine(ChildServer):
    """A running SGLang server (`relax.utils.proc.ChildServer`). SGLang answers /health 503
    until its warm-up request has run, so readiness waits longer by default."""

    name = "sglang"
    poll_s, health_timeout_s, trust_env = 0.5, 5.0, False
    not_ready_hint = " (raise --engine-startup-timeout if it was still loading)"

    def wait_ready(self, timeout: float = 600.0) -> "SGLangEngine":
        return super().wait_ready(timeout)


def gpu_ids(device: str) -> list[str] | None:
    """"cuda:2,3" -> ["2", "3"]; "cuda" -> None (the GPUs the environment shows). "cpu" and
    anything else: ValueError, SGLang needs a GPU."""
    kind, _, ids = device.partition(":")
    if kind != "cuda":
        raise ValueError(f"device {device!r}: SGLang needs a GPU (cuda:<ids>); on CPU use --rollout-backend hf")
    listed = [i.strip() for i in ids.split(",") if i.strip()]
    return listed or None


def tensor_parallel(options: Mapping[str, Any], ids: list[str] | None) -> dict[str, Any]:
    """`options` with `tp_size` = the number of GPUs; a `tp_size` given must agree."""
    options = dict(options)
    if ids is None:
        return options
    given = options.get("tp_size")
    if given is not None and int(given) != len(ids):
        raise ValueError(f"tp_size {given} (--sglang-tp-size / --rollout-num-gpus-per-engine) disagrees with the "
                         f"{len(ids)} GPU(s) of device cuda:{','.join(ids)} this engine was placed on; make them equal")
    options["tp_size"] = len(ids)
    return options


def engine_command(model_path: str, *, host: str, port: int, device: str, api_key: str | None = None,
                   options: Mapping[str, Any] | None = None, extra_args: Sequence[str] = (),
                   env: Mapping[str, str] | None = None, num_threads: int | None = None,
                   ) -> tuple[list[str], dict[str, str]]:
    """The server's argv and environment: GPUs by CUDA_VISIBLE_DEVICES, tensor parallel over
    them, the API key in `API_KEY_ENV` (never in argv). ValueError for a CPU device, a
    `tp_size` that disagrees with the GPUs, or an option Relax sets itself."""
    ids = gpu_ids(device)
    argv = [sys.executable, "-m", "relax.backends.sglang.server",
            *server_argv(model_path, host, port, tensor_parallel(options or {}, ids)), *extra_args]
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, child_env.get("PYTHONPATH")) if p)
    if ids is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    if num_threads:
        child_env["OMP_NUM_THREADS"] = str(num_threads)
    child_env.pop(API_KEY_ENV, None)
    if api_key:
        child_env[API_KEY_ENV] = api_key
    child_env[PARENT_PID_ENV] = str(os.getpid())
    return argv, child_env


def launch_sglang_engine(model_path: str, *, host: str = "127.0.0.1", port: int | None = None,
                         api_key: str | None = None, device: str = "cuda:0", extra_args: Sequence[str] = (),
                         env: Mapping[str, str] | None = None, log_path: str | None = None,
                         num_threads: int | None = None, options: Mapping[str, Any] | None = None) -> SGLangEngine:
    """Start the server (not yet ready: call `.wait_ready(timeout)`). `options`: SGLang
    `ServerArgs` names (checked by SGLang's parser at config time, `check_engine_options` in `args.py`);
    `device`: "cuda:<GPU ids>", the engine's GPUs, one tensor-parallel rank each."""
    port = port or free_port(host)
    argv, child_env = engine_command(model_path, host=host, port=port, device=device, api_key=api_key,
                                     options=options, extra_args=extra_args, env=env, num_threads=num_threads)
    if not sglang_available():
        raise RuntimeError("sglang is not installed: pip install 'sglang[all]' (or use --rollout-backend hf)")
    check_routed_experts(options or {})  # R3's --enable-return-routed-experts: SGLang >= 0.5.8 (routing.py)
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix=f"sglang-engine-{port}-", suffix=".log")
        os.close(fd)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=child_env)
    url_host = f"[{host}]" if ":" in host else host
    logger.info("sglang engine pid %d on %s at http://%s:%d; log %s", process.pid, device, url_host, port, log_path)
    return SGLangEngine(process, f"http://{url_host}:{port}", log_path)
