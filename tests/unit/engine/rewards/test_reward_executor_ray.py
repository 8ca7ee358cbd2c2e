"""The executor inside a Ray job uses Ray actors as its worker pool (slower: starts Ray)."""

import asyncio
from types import SimpleNamespace

import pytest
import reward_plugins_for_tests as plugins

from executors import executor_for
from relax.engine.rewards.worker import _RayWorker
from relax.types import Sample

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started_here:
        ray.shutdown()


def test_ray_actor_pool_scores_math_verify_and_replaces_a_hung_actor(ray_cluster):
    executor = executor_for(SimpleNamespace(custom_rm_path=f"{plugins.__name__}.sync_reward", reward_timeout=2.0,
                                              reward_num_workers=1, reward_failure_value=-1.0))
    samples = [Sample(index=0, response="x", label="hang"), Sample(index=1, response="x", label="x"),
               Sample(index=2, response="x", label="boom")]
    try:
        asyncio.run(executor.score(samples))
        assert all(isinstance(worker, _RayWorker) for worker in executor._pool._idle)
        stats = executor.stats()
    finally:
        executor.close()
    assert [s.reward for s in samples] == [-1.0, 1.0, -1.0]
    assert stats["reward/timeouts"] == 1 and stats["reward/failures"] == 2
    assert stats["reward/workers_replaced"] == 1
    assert samples[1].metadata["seen_by"] == "sync_reward"


def test_ray_actor_pool_runs_builtin_math_verify(ray_cluster):
    executor = executor_for(SimpleNamespace(rm_type="math", reward_num_workers=1))
    samples = [Sample(index=0, response=r"\boxed{\frac{1}{2}}", label="0.5")]
    try:
        asyncio.run(executor.score(samples))
    finally:
        executor.close()
    assert samples[0].reward == 1.0 and executor.stats()["reward/pool"] == 1
