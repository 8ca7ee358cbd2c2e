"""The engine process dies with the thread that launched it, set up in the engine itself (the
launcher passes no preexec_fn: gRPC's fork handlers in a Ray process could abort the child)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from relax.utils.proc import PARENT_PID_ENV

CHILD = "from relax.utils.proc import die_with_parent; import time; die_with_parent(); time.sleep(60)"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_engine_process_is_killed_when_its_launcher_exits():
    parent = textwrap.dedent(f"""
        import os, subprocess, sys, time
        env = dict(os.environ, {PARENT_PID_ENV}=str(os.getpid()))
        child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env=env)
        print(child.pid, flush=True)
        time.sleep(3)  # the child sets its death signal
    """)
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60, check=True)
    child = int(out.stdout.split()[0])
    deadline = time.time() + 10
    while alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def test_engine_started_for_a_parent_that_is_gone_exits():
    env = dict(os.environ, **{PARENT_PID_ENV: "1"})  # not our parent: the launcher already died
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, timeout=30)
    assert proc.returncode == 1
