"""Child processes of a launcher (engines, routers): what an error message says about one
(exited with which code or signal, stopped, or running but silent, and the tail of its log), and
`die_with_parent`, the first act of every launched server. Shared by every launcher."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "RELAX_ENGINE_PARENT_PID"  # the launcher's pid, set in the child's environment


def die_with_parent(parent_env: str = PARENT_PID_ENV) -> None:
    """Called first thing in a launched process: SIGKILL when the launching *thread* exits
    (PR_SET_PDEATHSIG, Linux). If the parent named by `parent_env` already died (we were
    re-parented before prctl took effect), exit now. No `preexec_fn` is used instead: in a Ray
    process gRPC's fork handlers can abort a child between fork and exec."""
    expected = os.environ.get(parent_env)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)


def log_tail(path: str, chars: int = 4000) -> str:
    """The last `chars` characters of a log file (a note instead when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


def exit_description(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def process_state(process: subprocess.Popen) -> str:
    """'exited with code 1', 'was killed by SIGKILL', 'is stopped (SIGSTOP)' or 'is running
    but did not answer'."""
    code = process.poll()
    if code is not None:
        return exit_description(code)
    try:
        with open(f"/proc/{process.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = "?"
    if state in ("T", "t"):
        return "is stopped (SIGSTOP or a debugger) and did not answer"
    return "is running but did not answer"


def describe_process(kind: str, process: subprocess.Popen, url: str, log_path: str, tail_chars: int = 2000) -> str:
    return (f"{kind} engine pid {process.pid} at {url} {process_state(process)}; log {log_path}, ending:\n"
            f"{log_tail(log_path, tail_chars).rstrip()}")


def processes_with_env(key: str, value: str) -> list[int]:
    """Pids of this user's processes whose environment holds `key=value` (not this process)."""
    needle = f"{key}={value}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:
            continue
    return pids
