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
    local.start_local_ray(3, **kwargs)
    return seen


def test_a_local_ray_starts_no_idle_workers_ahead(monkeypatch):
    kw = _init_kwargs(monkeypatch, log_to_driver=False)
    assert kw["_system_config"] == {"prestart_worker_first_driver": False}
    assert kw["num_cpus"] == 3 and kw["_node_ip_address"] == "127.0.0.1" and kw["log_to_driver"] is False


def test_a_callers_system_config_is_kept_beside_it(monkeypatch):
    kw = _init_kwargs(monkeypatch, _system_config={"object_timeout_milliseconds": 5})
    assert kw["_system_config"] == {"prestart_worker_first_driver": False, "object_timeout_milliseconds": 5}
