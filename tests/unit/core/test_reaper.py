"""The reaper kills the run's processes when its driver goes without a word, and nothing when the
driver says the run ended cleanly. Real processes: the reaper, and children carrying a run id."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from relax.core import reaper

RUN_ENV = "RELAX_TEST_REAPER_RUN"


def child(run_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env=dict(os.environ, **{RUN_ENV: run_id}))


def test_a_driver_that_dies_takes_its_run_with_it():
    run_id = uuid.uuid4().hex
    worker = child(run_id)
    stranger = child("another-run")
    r = reaper.start(run_id, RUN_ENV)
    try:
        r.stdin.close()  # what the driver's death looks like to the reaper
        assert r.wait(timeout=30) == 0
        assert worker.wait(timeout=5) == -9
        time.sleep(0.2)
        assert stranger.poll() is None  # another run's process is left alone
    finally:
        for p in (worker, stranger):
            p.kill()


def test_a_clean_end_kills_nothing():
    run_id = uuid.uuid4().hex
    worker = child(run_id)
    r = reaper.start(run_id, RUN_ENV)
    try:
        # (A run releases its reaper long after starting it; this one may still be starting, on a
        # loaded machine for seconds: the test gives it time, what it checks is that it exits clean.)
        reaper.release(r, timeout=60)
        assert r.returncode == 0
        time.sleep(0.2)
        assert worker.poll() is None
    finally:
        worker.kill()


def test_a_reaper_that_does_not_exit_on_release_is_killed_and_waited_for():
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    reaper.release(stuck, timeout=0.5)
    assert stuck.returncode == -9  # gone, not left a zombie for the driver's exit
