"""`start_local_ray`'s options to `ray.init` (relax.distributed.ray.local): a loopback node without
Ray's idle-worker prestart, whatever system config the caller adds."""

from __future__ import annotations

import ray

from relax.distributed.ray import local


def _init_kwargs(monkeypatch, **kwargs) -> dict:
    seen: dict = {}
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    from ray._private import ray_constants

    # What it sets besides, restored after the test.
    monkeypatch.setenv(local.LOCAL_ONLY_ENV, "1")
    monkeypatch.setenv(local.GCS_RECONNECT_ENV, local.GCS_RECONNECT_S)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    for name in local.LOCAL_RAY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REPORTER_UPDATE_INTERVAL_MS", "7000")  # the caller's
    local.start_local_ray(3, **kwargs)
    return seen


def test_a_local_ray_starts_no_idle_workers_ahead(monkeypatch):
    kw = _init_kwargs(monkeypatch, log_to_driver=False)
    assert kw["_system_config"] == {"prestart_worker_first_driver": False}
    assert kw["num_cpus"] == 3 and kw["_node_ip_address"] == "127.0.0.1" and kw["log_to_driver"] is False


def test_rays_background_loops_slow_down_unless_the_environment_says_otherwise(monkeypatch):
    import os

    _init_kwargs(monkeypatch)
    assert os.environ["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.5"
    assert os.environ["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] == "1000"
    assert os.environ["REPORTER_UPDATE_INTERVAL_MS"] == "7000"


def test_a_callers_system_config_is_kept_beside_it(monkeypatch):
    kw = _init_kwargs(monkeypatch, _system_config={"object_timeout_milliseconds": 5})
    assert kw["_system_config"] == {"prestart_worker_first_driver": False, "object_timeout_milliseconds": 5}


def _failing_init(monkeypatch, failures: list[Exception]) -> tuple[list[dict], list]:
    """ray.init raising each of `failures` in turn, then succeeding; each try starts a child process
    (as Ray's GCS would) that a retry must stop. Returns (the calls' kwargs, the children)."""
    import subprocess
    import sys

    from ray._private import ray_constants

    calls: list[dict] = []
    children: list[subprocess.Popen] = []

    def init(**kw):
        calls.append(kw)
        children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setenv(local.LOCAL_ONLY_ENV, "1")
    monkeypatch.setenv(local.GCS_RECONNECT_ENV, local.GCS_RECONNECT_S)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    for name in local.LOCAL_RAY_ENV:
        monkeypatch.setenv(name, "1")
    return calls, children


def test_a_node_that_misses_the_registration_deadline_is_stopped_and_started_again(monkeypatch):
    timeout = Exception("The current node timed out during startup. This could happen because ...")
    calls, started = _failing_init(monkeypatch, [timeout, timeout])
    local.start_local_ray(2, _system_config={"a": 1})
    assert len(calls) == 3
    assert all(c["_system_config"] == {"prestart_worker_first_driver": False, "a": 1} for c in calls)
    assert all(p.poll() is not None for p in started[:2])  # the failed tries' processes are gone
    assert started[2].poll() is None  # the started node's stay
    started[2].kill()
    started[2].wait()


def test_other_failures_and_the_last_timeout_are_raised(monkeypatch):
    import pytest

    calls, started = _failing_init(monkeypatch, [RuntimeError("port taken")])
    with pytest.raises(RuntimeError, match="port taken"):
        local.start_local_ray(2)
    assert len(calls) == 1
    started[0].kill()

    timeouts = [Exception("timed out during startup")] * local.START_ATTEMPTS
    calls, started = _failing_init(monkeypatch, timeouts)
    with pytest.raises(Exception, match="timed out during startup"):
        local.start_local_ray(2)
    assert len(calls) == local.START_ATTEMPTS
    for proc in started:
        proc.kill()
        proc.wait()
