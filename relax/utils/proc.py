"""Child processes of a launcher (engines, routers): what an error message says about one
(exited with which code or signal, stopped, or running but silent, and the tail of its log), and
`die_with_parent`, the first act of every launched server. Shared by every launcher. And how to
find a run's processes without their parent (relax.core.reaper): by an environment variable, by
the Ray session directory they write in, by the process tree."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Mapping

PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "RELAX_ENGINE_PARENT_PID"  # the launcher's pid, set in the child's environment
RUN_ENV = "RELAX_RUN_ID"  # every process of a run has it: the reaper finds them by it, TQ partitions are `<run id>/...`

# The environment of a process that computes with torch on the CPU (a training rank, an engine): OpenMP
# threads waiting for work sleep instead of spinning (GNU OpenMP's default spins first). On a CPU that
# other busy processes share (colocate's roles and engines, two CI workers, a laptop) a spinning thread
# holds the core its team's descheduled thread needs, at every barrier: on 2 cores, a 3-step colocate run
# whose trainer rank had 2 threads beside one busy process took 143 s and 76.5 CPU-s in that rank; with
# this, 66 s and 7.4 CPU-s (1 thread: 61 s, 6.2 CPU-s). Read when torch loads: set before the process starts.
CPU_COMPUTE_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def cpu_compute_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`CPU_COMPUTE_ENV`, less what `environ` (default: this process's environment) sets itself: the
    user's choice stands."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in CPU_COMPUTE_ENV.items() if k not in environ}


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


def processes_writing_under(dirs: list[str]) -> list[int]:
    """Pids of this user's processes (not this one) that hold a file under one of `dirs` (Ray
    session directories) open for writing. Every process of a Ray session writes its logs there,
    even one that renamed itself (`ray::DashboardAgent`: that also wipes its environment as /proc
    shows it); a process that only reads them (`tail -f .../raylet.out`) is not counted."""
    roots = tuple(os.path.join(os.path.abspath(d), "") for d in dirs)
    pids = []
    for name in os.listdir("/proc") if roots else ():
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        if any(_writes_under(name, fd, roots) for fd in fds):
            pids.append(int(name))
    return pids


def _writes_under(pid: str, fd: str, roots: tuple[str, ...]) -> bool:
    try:
        if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith(roots):
            return False
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False  # closed meanwhile
    return flags & os.O_ACCMODE != os.O_RDONLY


def descendants(pids: set[int]) -> set[int]:
    """Every live process below `pids` in the process tree (children, their children...)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = set(), list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


KILL_WAIT_S = 30.0  # ChildServer.terminate: how long a SIGKILLed child may take to exit


class ChildServer:
    """A launched HTTP server process: `url`, `alive()`, `describe()`, `wait_ready()` (polls
    `GET /health` until 200), `terminate()` (SIGTERM, then SIGKILL). Each engine launcher
    subclasses it with its name, poll interval and not-ready hint."""

    name = "engine"
    poll_s, health_timeout_s, trust_env = 0.1, 2.0, True
    not_ready_hint = ""  # appended to the not-ready error, e.g. which flag raises the timeout
    temp_log = False  # `log_path` was made in the temp dir for it: removed once it stops cleanly (`terminate`)

    def __init__(self, process: subprocess.Popen, url: str, log_path: str):
        self.process, self.url, self.log_path = process, url, log_path

    def alive(self) -> bool:
        return self.process.poll() is None

    def describe(self) -> str:
        """Which engine this is, its state (exited with what, stopped, silent) and its log's end."""
        return describe_process(self.name, self.process, self.url, self.log_path)

    def wait_ready(self, timeout: float = 120.0) -> "ChildServer":
        """Poll GET /health until 200; RuntimeError with the log tail if it dies or times out."""
        import httpx

        deadline = time.monotonic() + timeout
        # One client for every poll: each new one builds a TLS context (~22 ms of CPU, loading the CA
        # bundle), which at 10 polls a second made an engine's start-up cost its launcher ~2 s of CPU.
        with httpx.Client(timeout=self.health_timeout_s, trust_env=self.trust_env) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RuntimeError(f"{self.name} engine at {self.url} exited with code {self.process.returncode} "
                                       f"before becoming ready; log {self.log_path}:\n{log_tail(self.log_path)}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass  # not listening yet
                time.sleep(self.poll_s)
        raise RuntimeError(f"{self.name} engine at {self.url} not ready after {timeout:.0f}s{self.not_ready_hint}; "
                           f"log {self.log_path}:\n{log_tail(self.log_path)}")

    def terminate(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; returns the exit code. A killed process is
        waited for up to KILL_WAIT_S whatever `timeout` is: tearing down a large process (a hung
        engine's ~0.5 GB) can take over a second on a loaded machine. A `temp_log` goes with a server
        that stopped cleanly (exit 0, or SIGTERM's code after a graceful shutdown, as uvicorn exits);
        one that failed or had to be killed keeps it (its errors name it)."""
        clean = {0}
        if self.alive():
            self.process.terminate()
            clean.add(-signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(max(timeout, KILL_WAIT_S))
        if self.temp_log and self.process.returncode in clean:
            try:
                os.remove(self.log_path)
            except OSError:
                pass
        return self.process.returncode

    def __enter__(self) -> "ChildServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()
