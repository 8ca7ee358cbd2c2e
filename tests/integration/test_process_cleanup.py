"""A run leaves no process behind: not after a normal exit, not after Ctrl-C or SIGTERM, and not
for more than a few seconds after its driver is killed with SIGKILL, however it was launched.

Each run is a real `relax-train` subprocess with its own private Ray instance, started the way
launchers start one (`subprocess_runs.LAUNCHERS`): in the background of a non-interactive shell
through scripts/entrypoint/local.sh (SIGINT ignored, as in CI and job scripts), under `setsid`
(its own session, as job schedulers do), or as the test's own child. Every process it starts
inherits a marker env var, and Ray's own processes refer to the run's Ray session directory (its
dashboard and runtime-env agents rename themselves, which wipes their environment from /proc):
after the signal we look for any live process found either way. The normal exit is checked on the
colocate GRPO run (test_colocate_grpo.py), itself such a subprocess.
"""

from __future__ import annotations

import os
import signal

import pytest
from subprocess_runs import Run, wait_until_gone

pytestmark = pytest.mark.integration


def test_sigterm_stops_a_run_launched_in_the_background_under_setsid_within_10_s(interrupted_run):
    """The shared colocate run (conftest: also the true on-policy and security run), launched by a
    script in its own session (`setsid`) that runs it in the background of its non-interactive
    shell through local.sh, so its SIGINT is ignored: asyncio then installs no Ctrl-C handler and
    `interrupt_main(SIGINT)` does nothing. SIGTERM after two steps still takes Ctrl-C's teardown:
    exit 143 with its message (not Ray's abort), and 10 s after the signal no process of the run is
    left, Ray's agents included. SIGINT stayed ignored, as the launcher chose."""
    run = interrupted_run
    assert run.sigint_ignored  # the launch condition holds, and the run left the launcher's choice alone
    assert run.session == run.proc.pid != os.getsid(0)  # the launching script's own session
    assert run.processes_before_signal > 3  # driver, raylet, workers, engine...
    assert run.proc.returncode == 143, run.output()[-3000:]
    assert "relax-train: terminated (SIGTERM); all run processes were stopped" in run.output()
    assert run.left == [], (run.exit_s, run.output()[-3000:])


def test_sigkill_of_a_driver_launched_in_the_background_leaves_nothing_after_5_s(tiny_setup, tmp_path):
    """A script runs the driver in the background of its non-interactive shell through local.sh;
    the driver is killed with SIGKILL once training runs: 5 s later no process of the run is left,
    Ray's dashboard and runtime-env agents included (found by the run's Ray session: renaming
    themselves wiped the marker from their environment as /proc shows it)."""
    run = Run(tiny_setup, tmp_path, 1000, launch="background")
    try:
        assert run.wait_for("step 1/1000"), run.output()[-5000:]
        run.stop(signal.SIGKILL, gone_within=5)
    finally:
        run.kill_if_running()
    assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= run.names_before_signal, run.names_before_signal
    assert run.left == [], run.exit_s


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
