"""A run leaves no process behind: not after a normal exit, not after Ctrl-C or SIGTERM, and not
for more than a few seconds after its driver is killed with SIGKILL.

Each run is a real `relax-train` subprocess with its own private Ray instance. Every process
it starts (raylet, workers, Serve replicas, train workers, engines) inherits a marker env
var; after the run we look for any live process that still carries it. The normal exit is
checked on the colocate GRPO run (test_colocate_grpo.py), itself such a subprocess.
"""

from __future__ import annotations

import pytest
from subprocess_runs import Run, marked_processes, wait_until_gone

pytestmark = pytest.mark.integration



def test_sigterm_stops_like_ctrl_c_and_leaves_no_process(interrupted_run):
    """Colocate; the run (shared with the true on-policy test) got SIGTERM after two steps: the
    driver takes Ctrl-C's path (exit 130, not Ray's abort) and Ray's agents go with it."""
    run = interrupted_run
    assert run.processes_before_signal > 3  # driver, raylet, workers, engine...
    assert run.proc.returncode == 130, run.output()[-3000:]
    assert "relax-train: interrupted; all run processes were stopped" in run.output()
    assert wait_until_gone(run.marker, timeout=10) == []


def test_sigkill_of_the_driver_leaves_nothing_after_a_few_seconds(tiny_setup, tmp_path):
    run = Run(tiny_setup, tmp_path, 1000)
    assert run.wait_for("step 1/1000"), run.output()[-5000:]
    assert len(marked_processes(run.marker)) > 3
    run.proc.kill()
    run.proc.wait(timeout=30)
    assert wait_until_gone(run.marker, timeout=10) == []


def test_ctrl_c_in_fully_async_mode_leaves_no_process(fully_async_interrupted_run):
    """Fully async adds role loops in flight (rollout ahead, ActorFwd, Critic and Advantages
    mid-step) at the signal; the run is shared with the staleness-bound test."""
    run = fully_async_interrupted_run
    assert run.processes_before_signal > 6
    assert run.proc.returncode == 130, run.output()[-3000:]
    assert wait_until_gone(run.marker, timeout=10) == []


def test_a_plan_that_does_not_fit_the_cluster_fails_cleanly_and_leaves_nothing(tiny_setup, tmp_path):
    """Checked once the run's own Ray is up (1 logical CPU here): exit 2 with the plan error, and the
    Ray it started, its reaper and its token file are gone."""
    run = Run(tiny_setup, tmp_path, 1, ("--ray-num-cpus", "1"))
    run.proc.wait(timeout=120)
    assert run.proc.returncode == 2, run.output()[-3000:]
    assert "relax-train: error:" in run.output() and "CPU" in run.output()
    assert wait_until_gone(run.marker, timeout=10) == []
    assert list((tmp_path / ".relax").glob("run_token-*")) == []
