import asyncio
import os
from types import SimpleNamespace

import pytest
import reward_plugins_for_tests as plugins

from executors import executor_for
from relax.engine.rewards.worker import RewardWorkerError, WorkerDied, execute, process_pool
from relax.types import Sample


def test_execute_turns_exceptions_into_error_replies():
    assert execute(("builtin", "f1", "a b", "a b", {})) == ("ok", 1.0)
    kind, message = execute(("builtin", "nope", "a", "a", {}))
    assert kind == "error" and "unknown rm_type 'nope'" in message


def test_worker_that_fails_to_start_reports_why():
    pool = process_pool(1, ["no_such_module_for_reward_tests.fn"])
    try:
        with pytest.raises(WorkerDied, match="start-up failed"):
            asyncio.run(pool.run(("builtin", "f1", "a", "a", {}), timeout=5))
    finally:
        pool.close()


def test_reward_error_in_worker_keeps_the_worker():
    pool = process_pool(1, ["relax.engine.rewards.registry"])

    async def two_calls():
        with pytest.raises(RewardWorkerError, match="unknown rm_type"):
            await pool.run(("builtin", "nope", "a", "a", {}), timeout=5)
        return await pool.run(("builtin", "f1", "a", "a", {}), timeout=5)

    try:
        assert asyncio.run(two_calls()) == 1.0
        assert pool.replaced == 0
    finally:
        pool.close()


def test_crashed_worker_is_counted_and_replaced():
    args = SimpleNamespace(custom_rm_path=f"{plugins.__name__}.crash_reward", reward_failure_value=0.0,
                           reward_num_workers=1)
    executor = executor_for(args)
    samples = [Sample(index=0, label="crash"), Sample(index=1, label="fine")]
    try:
        asyncio.run(executor.score(samples))
    finally:
        executor.close()
    assert [s.reward for s in samples] == [0.0, 1.0]
    assert executor.stats()["reward/failures"] == 1 and executor.stats()["reward/workers_replaced"] == 1


def test_close_stops_worker_processes():
    pool = process_pool(1, [])
    asyncio.run(pool.run(("builtin", "f1", "a", "a", {}), timeout=5))
    (worker,) = pool._idle
    pool.close()
    assert not worker.process.is_alive()
    assert worker.process.exitcode == 0 or os.name != "posix"
