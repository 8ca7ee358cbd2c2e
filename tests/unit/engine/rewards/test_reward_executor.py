import asyncio
from types import SimpleNamespace

import pytest
import reward_plugins_for_tests as plugins
from reward_test_server import ScriptedRewardServer

from executors import executor_for
from relax.types import Sample
from relax.utils.plugins import PluginError

PLUGINS = plugins.__name__


def make_args(**overrides):
    base = dict(rm_type=None, custom_rm_path=None, reward_key=None, group_rm=False, rm_url=None,
                reward_timeout=5.0, reward_num_workers=1, reward_max_concurrency=64, reward_failure_value=-7.0)
    base.update(overrides)
    return SimpleNamespace(**base)


def samples_for(pairs, **metadata):
    return [Sample(index=i, response=r, label=label, metadata=dict(metadata)) for i, (r, label) in enumerate(pairs)]


def run_score(executor, samples, **kwargs):
    try:
        asyncio.run(executor.score(samples, **kwargs))
    finally:
        executor.close()
    return [s.reward for s in samples]


def test_builtin_math_uses_fast_path_inline_and_pool_for_math_verify():
    executor = executor_for(make_args(rm_type="math"))
    samples = samples_for([(r"\boxed{0.5}", "0.5"), (r"\boxed{\frac{1}{2}}", "0.5"), ("no box", "0.5")])
    assert run_score(executor, samples) == [1.0, 1.0, 0.0]
    stats = executor.stats()
    assert stats["reward/inline"] == 2 and stats["reward/pool"] == 1 and stats["reward/failures"] == 0


def test_row_metadata_rm_type_overrides_the_flag():
    executor = executor_for(make_args(rm_type="math"))
    samples = samples_for([("The Eiffel Tower", "Eiffel Tower in Paris")], rm_type="f1")
    assert run_score(executor, samples) == [pytest.approx(2 / 3)]


def test_unknown_rm_type_fails_at_construction():
    with pytest.raises(ValueError, match="unknown rm_type 'nope'"):
        executor_for(make_args(rm_type="nope"))


def test_row_without_any_reward_type_fails_that_row_only():
    executor = executor_for(make_args())
    samples = samples_for([("a", "a")]) + samples_for([("a", "a")], rm_type="f1")
    assert run_score(executor, samples) == [-7.0, 1.0]
    assert executor.stats()["reward/failures"] == 1


def test_custom_sync_reward_hang_and_raise_fail_without_blocking_others(caplog):
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.sync_reward", reward_timeout=3.0,
                                        reward_num_workers=2))
    samples = samples_for([("x", "x"), ("x", "hang"), ("y", "y"), ("x", "boom"), ("x", "z")])
    assert run_score(executor, samples) == [1.0, -7.0, 1.0, -7.0, 0.0]
    stats = executor.stats()
    assert stats["reward/failures"] == 2 and stats["reward/timeouts"] == 1
    assert samples[0].metadata["seen_by"] == "sync_reward"  # notes made in the worker come back
    assert "sample index 3" in caplog.text and "boom on purpose" in caplog.text
    assert "sample index 1" in caplog.text and "timed out" in caplog.text


def test_hung_worker_is_replaced_and_the_pool_keeps_working():
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.sync_reward", reward_timeout=3.0,
                                        reward_num_workers=1))
    try:
        first, second = samples_for([("x", "hang")]), samples_for([("x", "x"), ("y", "y")])
        asyncio.run(executor.score(first))
        asyncio.run(executor.score(second))
        assert [s.reward for s in first + second] == [-7.0, 1.0, 1.0]
        assert executor.stats()["reward/workers_replaced"] == 1
    finally:
        executor.close()


def test_custom_async_reward_hang_and_raise_are_counted():
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.async_reward", reward_timeout=0.2))
    samples = samples_for([("x", "hang"), ("x", "boom"), ("x", "x")])
    assert run_score(executor, samples) == [-7.0, -7.0, 1.0]
    assert executor.stats()["reward/timeouts"] == 1 and executor.stats()["reward/failures"] == 2


def test_concurrency_is_capped():
    plugins.IN_FLIGHT.update(now=0, max=0)
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.counting_reward", reward_max_concurrency=3))
    run_score(executor, samples_for([("x", "x")] * 10))
    assert plugins.IN_FLIGHT["max"] == 3


def test_custom_reward_wins_over_builtin_and_gets_kwargs():
    executor = executor_for(make_args(rm_type="math", custom_rm_path=f"{PLUGINS}.kwargs_reward", base=1))
    samples = samples_for([("x", "y")], rm_type="f1")
    assert run_score(executor, samples, bonus=2) == [3.0]


def test_reward_key_selects_the_score_of_dict_rewards():
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.dict_reward", reward_key="score"))
    samples = samples_for([("x", "x")])
    run_score(executor, samples)
    assert samples[0].reward == {"score": 0.5, "acc": True}
    assert executor.reward_value(samples[0]) == 0.5
    with pytest.raises(ValueError, match="--reward-key"):
        executor_for(make_args(custom_rm_path=f"{PLUGINS}.dict_reward")).reward_value(samples[0])


def test_group_rm_async_scores_the_whole_list():
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.group_reward", group_rm=True))
    assert run_score(executor, samples_for([("a", "a")] * 3)) == [0.0, 1.0, 2.0]


def test_group_rm_sync_runs_in_a_worker_and_returns_notes():
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.sync_group_reward", group_rm=True))
    samples = samples_for([("a", "a"), ("a", "b")])
    assert run_score(executor, samples) == [1.0, 0.0]
    assert samples[1].metadata["group_size"] == 2


def test_group_rm_wrong_length_fails_every_sample():
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.short_group_reward", group_rm=True))
    assert run_score(executor, samples_for([("a", "a")] * 3)) == [-7.0] * 3
    assert executor.stats()["reward/failures"] == 3


def test_wrong_plugin_signature_names_the_flag_and_expected_signature():
    with pytest.raises(PluginError, match=r"--custom-rm-path.*reward_func\(args, sample"):
        executor_for(make_args(custom_rm_path=f"{PLUGINS}.wrong_signature"))
    with pytest.raises(PluginError, match=r"--custom-rm-path.*reward_func\(args, samples"):
        executor_for(make_args(custom_rm_path=f"{PLUGINS}.wrong_signature", group_rm=True))


def test_unpicklable_args_run_sync_rewards_in_threads():
    executor = executor_for(make_args(custom_rm_path=f"{PLUGINS}.sync_reward", unpicklable=lambda: None))
    assert run_score(executor, samples_for([("x", "x"), ("x", "boom")])) == [1.0, -7.0]
    assert executor.stats()["reward/pool"] == 0


def test_remote_rm_through_the_executor_retries_after_500():
    with ScriptedRewardServer([(500, "busy"), (200, {"score": 0.9})]) as server:
        executor = executor_for(make_args(rm_type="remote_rm", rm_url=server.url))
        samples = [Sample(index=0, prompt="p", response="r", label="l")]
        assert run_score(executor, samples) == [0.9]
    assert [r["prompt"] for r in server.requests] == ["p", "p"]


def test_invalid_limits_name_their_flag():
    with pytest.raises(ValueError, match="--reward-timeout"):
        executor_for(make_args(rm_type="math", reward_timeout=0))
