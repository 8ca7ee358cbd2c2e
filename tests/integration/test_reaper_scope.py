"""The reaper (relax.core.reaper) tells the run's processes from every other one: it kills a process
that carries the run's id, writes in the run's Ray session directory, or runs below such a process;
never one that only reads the run's logs (`tail -f`), one of another session (whose name may begin
like the run's), or one of another run. Small processes stand in for Ray's here; the killed-driver
runs of test_process_cleanup.py check it on a real run."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from relax.core.reaper import run_processes, sessions_started_by

pytestmark = pytest.mark.integration


@pytest.fixture
def spawn():
    started: list[subprocess.Popen] = []

    def start(cmd: list[str], log=None, env: dict[str, str] | None = None) -> int:
        with open(log or os.devnull, "a") as out:  # the process holds it open for writing
            started.append(subprocess.Popen(cmd, stdout=out, env={**os.environ, **(env or {})}))
        return started[-1].pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_the_reaper_takes_the_runs_processes_and_no_other(spawn, tmp_path):
    ours, other = tmp_path / "session_1", tmp_path / "session_12"  # one name begins like the other
    for session in (ours, other):
        (session / "logs").mkdir(parents=True)
    log = ours / "logs" / "agent.out"
    writer = spawn(["sleep", "60"], log=log)  # Ray's processes write their logs there
    parent = spawn(["bash", "-c", "sleep 60 > /dev/null & wait"], log=log)  # its child writes nowhere
    marked = spawn(["sleep", "60"], env={"RELAX_RUN_ID": "ours"})
    strangers = [spawn(["tail", "-f", str(log)]), spawn(["sleep", "60"], log=other / "logs" / "agent.out"),
                 spawn(["sleep", "60"], env={"RELAX_RUN_ID": "another"})]
    children = []
    while not children:  # bash starts its child
        children = psutil.Process(parent).children()
    child = children[0].pid

    found = run_processes("RELAX_RUN_ID", "ours", [str(ours)])

    assert {writer, parent, child, marked} <= found
    assert not found & set(strangers)


def test_a_driver_killed_while_ray_starts_names_its_session_by_its_pid(tmp_path):
    (tmp_path / "session_2026-01-01_00-00-00_000001_4242").mkdir()
    (tmp_path / "session_2026-01-01_00-00-00_000001_14242").mkdir()  # another driver's pid ending alike
    (tmp_path / "session_latest").symlink_to(tmp_path / "session_2026-01-01_00-00-00_000001_4242")

    assert sessions_started_by(4242, str(tmp_path), since=time.time() - 60) == [
        str(tmp_path / "session_2026-01-01_00-00-00_000001_4242")]
    assert sessions_started_by(4242, str(tmp_path), since=time.time() + 60) == []  # older than the reaper
    assert sessions_started_by(4242, str(tmp_path / "missing"), since=0) == []
