"""Start an `hf` engine server as a child process that dies with its parent.

`launch_hf_engine(model_path, ...)` runs `python -m relax.backends.hf.server` with the output
going to a log file, and limits CPU threads (default 1 on CPU: these engines share small
machines with trainers). The server's first act is `die_with_parent` (`PR_SET_PDEATHSIG=SIGKILL`
on Linux), so a crashed trainer never leaves an orphaned engine. Note the death signal fires
when the *thread* that started the child exits, so launch from a long-lived thread (the main
thread or the event loop's).

No `preexec_fn`: Python code between fork and exec runs the parent's `pthread_atfork` handlers,
and in a Ray process gRPC's handler can abort the child (seen: "epoll_wait error: Bad file
descriptor", SIGABRT, before the engine started). Without it the child is started with vfork
and the handlers never run.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence


from relax.utils.net import bound_socket
from relax.utils.proc import PARENT_PID_ENV, ChildServer, cpu_compute_env

logger = logging.getLogger(__name__)

API_KEY_ENV = "RELAX_HF_API_KEY"  # the key travels by environment, not argv (argv is world-readable)
_REPO_ROOT = str(Path(__file__).resolve().parents[3])





class EngineProcess(ChildServer):
    """A running hf engine server (`relax.utils.proc.ChildServer`), with the key it was given."""

    name = "hf"

    def __init__(self, process: subprocess.Popen, url: str, log_path: str, api_key: str | None):
        super().__init__(process, url, log_path)
        self.api_key = api_key


# Engine options (`--genrm-engine-config`, the rollout's context limit) -> server flags.
# `context_length` is SGLang's ServerArgs name for the same limit.
ENGINE_OPTIONS: dict[str, str] = {
    "max_context_len": "--max-context-len", "context_length": "--max-context-len",
    "max_running_requests": "--max-running-requests", "dtype": "--dtype", "batch_wait_ms": "--batch-wait-ms",
    "random_seed": "--random-seed", "served_model_name": "--served-model-name",
    "rl_on_policy_target": "--rl-on-policy-target", "load_format": "--load-format",
    "max_total_tokens": "--max-total-tokens", "disable_cuda_graph": "--disable-cuda-graph",
    "cuda_graph_max_bs": "--cuda-graph-max-bs",
    # LoRA (--lora-rank; relax.config.lora.engine_lora_options): SGLang's names, and the hf engine's alpha
    "enable_lora": "--enable-lora", "max_lora_rank": "--max-lora-rank", "lora_target_modules": "--lora-target-modules",
    "lora_alpha": "--lora-alpha",
    "enable_return_routed_experts": "--enable-return-routed-experts",  # R3 (docs/moe.md)
}
# store_true server flags: given when true
FLAG_OPTIONS = frozenset({"disable_cuda_graph", "enable_lora", "enable_return_routed_experts"})
# SGLang-only options (parallelism, memory pools) that mean nothing to this engine: accepted so
# one config serves both backends, and logged as ignored.
SGLANG_ONLY_OPTIONS = frozenset({"dp_size", "tp_size", "pp_size", "ep_size", "mem_fraction_static",
                                 "chunked_prefill_size", "max_prefill_tokens", "attention_backend", "kv_cache_dtype",
                                 "quantization"})


def engine_option_args(options: Mapping[str, Any] | None) -> list[str]:
    """Server flags for engine `options`; ValueError naming an unknown option and the known ones."""
    args: list[str] = []
    for key, value in (options or {}).items():
        if key in SGLANG_ONLY_OPTIONS:
            logger.warning("engine option %r applies to SGLang only; the hf engine ignores it", key)
            continue
        if key not in ENGINE_OPTIONS:
            raise ValueError(f"unknown engine option {key!r}; the hf engine takes {sorted(ENGINE_OPTIONS)} "
                             f"(SGLang-only options ignored here: {sorted(SGLANG_ONLY_OPTIONS)})")
        if key in FLAG_OPTIONS:
            args += [ENGINE_OPTIONS[key]] if value not in (None, False, "false", "False", 0) else []
        elif isinstance(value, (list, tuple)):  # a list option (--lora-target-modules q_proj v_proj)
            args += [ENGINE_OPTIONS[key], *map(str, value)]
        elif value is not None:
            args += [ENGINE_OPTIONS[key], str(value)]
    return args


def split_device(device: str) -> tuple[str, str | None]:
    """"cuda:3" -> ("cuda", "3"): the engine sees only that GPU. "cpu" / "cuda" stay as they are."""
    kind, _, ids = device.partition(":")
    if kind != "cuda" or not ids:
        return device, None
    if "," in ids:
        raise ValueError(f"device {device!r}: an hf engine runs on one GPU (tensor parallelism is SGLang's); "
                         "use --rollout-num-gpus-per-engine 1 with --rollout-backend hf")
    return "cuda", ids


def launch_hf_engine(model_path: str, *, host: str = "127.0.0.1", port: int | None = None,
                     api_key: str | None = None, device: str = "cpu", extra_args: Sequence[str] = (),
                     env: Mapping[str, str] | None = None, log_path: str | None = None,
                     num_threads: int | None = None, options: Mapping[str, Any] | None = None) -> EngineProcess:
    """Start the server (not yet ready: call `.wait_ready()`). `options`: see `ENGINE_OPTIONS`.
    `device`: "cpu", or "cuda:<GPU ids>" — the physical GPU the engine runs on (the fleet's GPU
    slot), set as its CUDA_VISIBLE_DEVICES; one GPU per hf engine."""
    option_args = engine_option_args(options)
    device, visible = split_device(device)
    listener = None if port else bound_socket(host)  # (held open into the server: no race for the port)
    port = port or listener.getsockname()[1]
    if num_threads is None and device == "cpu":
        num_threads = 1
    temp_log = log_path is None  # (a run's engines log into its directory; a bare launch into the temp dir)
    if temp_log:
        fd, log_path = tempfile.mkstemp(prefix=f"hf-engine-{port}-", suffix=".log")
        os.close(fd)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, child_env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "relax.backends.hf.server", "--model-path", str(model_path),
           "--host", host, "--port", str(port), "--device", device]
    if device == "cpu":
        child_env |= cpu_compute_env(child_env)  # (OpenMP threads that wait sleep, unless set otherwise)
    if num_threads:
        child_env["OMP_NUM_THREADS"] = str(num_threads)
        cmd += ["--num-threads", str(num_threads)]
    if visible is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = visible
    child_env.pop(API_KEY_ENV, None)
    if api_key:
        child_env[API_KEY_ENV] = api_key
    cmd += option_args + list(extra_args)
    if listener is not None:
        cmd += ["--listen-fd", str(listener.fileno())]
    try:
        with open(log_path, "ab") as log:
            child_env[PARENT_PID_ENV] = str(os.getpid())
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=child_env, pass_fds=() if listener is None else (listener.fileno(),))
    finally:
        if listener is not None:
            listener.close()  # the server holds its own copy
    url_host = f"[{host}]" if ":" in host else host
    engine = EngineProcess(process, f"http://{url_host}:{port}", log_path, api_key)
    engine.temp_log = temp_log
    return engine
