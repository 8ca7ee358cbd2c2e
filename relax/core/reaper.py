"""The run's reaper: when the driver of a run that started its own Ray dies without tearing down
(SIGKILL, OOM kill), nothing of the run outlives it by more than a few seconds.

Ray's fate sharing stops most of a private Ray when its driver dies, but its dashboard and
runtime-env agents first report the raylet's death to the (already dead) GCS and wait 60 s for
it. The reaper is a small process in its own session, started by the Runtime before Ray, that
blocks reading a pipe from the driver: the driver writes `done` after a clean teardown; end of
file means the driver died, and the reaper kills every process that carries the run's id
(`RELAX_RUN_ID`, inherited by every process of the private Ray) after a short grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from relax.utils.proc import processes_with_env

GRACE_S = 2.0  # Ray's own fate sharing goes first


def start(run_id: str, run_env: str) -> subprocess.Popen:
    """Start the reaper of run `run_id` (its processes carry `run_env=run_id` in their environment)."""
    env = {k: v for k, v in os.environ.items() if k != run_env}  # the reaper is not one of them
    return subprocess.Popen([sys.executable, "-m", "relax.core.reaper", run_env, run_id], stdin=subprocess.PIPE,
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL)


def release(reaper: subprocess.Popen) -> None:
    """The run ended cleanly: the reaper exits without touching anything."""
    try:
        reaper.stdin.write(b"done\n")
        reaper.stdin.close()
        reaper.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()


def main(run_env: str, run_id: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the terminal is the driver's to handle
    if sys.stdin.buffer.readline().strip() == b"done":
        return 0
    time.sleep(GRACE_S)
    for pid in processes_with_env(run_env, run_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
