"""The run's reaper: when the driver of a run that started its own Ray dies without tearing down
(SIGKILL, OOM kill), nothing of the run outlives it by more than a few seconds.

Ray's fate sharing stops most of a private Ray when its driver dies, but its dashboard and
runtime-env agents first report the raylet's death to the (already dead) GCS and wait for it. The
reaper is a small process in its own session, started by the Runtime before Ray, that reads a pipe
from the driver: once Ray is up the driver names Ray's session directory (`session <dir>`), and it
writes `done` after a clean teardown. End of file before `done` means the driver died: after a
short grace period the reaper kills every process of the run, found three ways:
- it carries the run's id in its environment (`RELAX_RUN_ID`: engines, workers, replicas);
- it writes in the run's Ray session directory (Ray's own processes: GCS, raylet, workers and the
  two agents, which rename themselves to `ray::DashboardAgent` and so wipe the id from their
  environment as /proc shows it);
- it runs below one of those in the process tree.
A driver killed while Ray starts has not named the session yet: the reaper takes the session
directories named after the driver's pid (Ray's `session_<date>_<pid>`) that appeared in Ray's temp
directory since the reaper started. Another Ray on the machine (another run's, a test session's)
has its own session directory and not this run's id: nothing of it is touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from relax.utils.proc import descendants, processes_with_env, processes_writing_under

GRACE_S = 1.0  # Ray's own fate sharing goes first
ROUNDS = 3  # a process may start while the others die (a worker the raylet was starting)


def start(run_id: str, run_env: str, ray_temp_dir: str = "") -> subprocess.Popen:
    """Start the reaper of run `run_id` (its processes carry `run_env=run_id` in their environment;
    the Ray this process is about to start keeps its sessions under `ray_temp_dir`)."""
    env = {k: v for k, v in os.environ.items() if k != run_env}  # the reaper is not one of them
    return subprocess.Popen([sys.executable, "-m", "relax.core.reaper", run_env, run_id, ray_temp_dir,
                             str(os.getpid())], stdin=subprocess.PIPE, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL)


def watch_session(reaper: subprocess.Popen, session_dir: str) -> None:
    """The run's Ray is up: its processes are the ones writing in `session_dir`."""
    reaper.stdin.write(f"session {session_dir}\n".encode())
    reaper.stdin.flush()


def release(reaper: subprocess.Popen, timeout: float = 5.0) -> None:
    """The run ended cleanly: the reaper exits without touching anything (one that has not within
    `timeout` seconds is killed, so that a driver's exit never waits on it)."""
    try:
        reaper.stdin.write(b"done\n")
        reaper.stdin.close()
        reaper.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()
        reaper.wait()


def run_processes(run_env: str, run_id: str, session_dirs: list[str]) -> set[int]:
    """Every live process of the run (see the module doc), this one left out."""
    found = set(processes_with_env(run_env, run_id)) | set(processes_writing_under(session_dirs))
    return (found | descendants(found)) - {os.getpid()}


def sessions_started_by(driver_pid: int, ray_temp_dir: str, since: float) -> list[str]:
    """Ray session directories of `ray_temp_dir` named after `driver_pid`, created since `since`."""
    try:
        names = os.listdir(ray_temp_dir)
    except OSError:
        return []
    paths = [os.path.join(ray_temp_dir, n) for n in names if n.startswith("session_") and n.endswith(f"_{driver_pid}")]
    return [p for p in paths if not os.path.islink(p) and os.path.isdir(p) and os.stat(p).st_ctime >= since - 1]


def main(run_env: str, run_id: str, ray_temp_dir: str, driver_pid: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the terminal is the driver's to handle
    started, sessions = time.time(), []
    while line := sys.stdin.buffer.readline():
        word, _, arg = line.strip().partition(b" ")
        if word == b"done":
            return 0
        if word == b"session":
            sessions.append(os.fsdecode(arg))
    time.sleep(GRACE_S)
    sessions = sessions or (sessions_started_by(int(driver_pid), ray_temp_dir, started) if ray_temp_dir else [])
    for _ in range(ROUNDS):
        pids = run_processes(run_env, run_id, sessions)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not pids:
            break
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
