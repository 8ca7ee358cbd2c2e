from types import SimpleNamespace

import pytest

from relax.engine.filters.dynamic_sampling_filters import (DynamicFilterOutput, as_filter_output,
                                                           check_reward_nonzero_std)
from relax.types import Sample

ARGS = SimpleNamespace(reward_key=None)


def group(*rewards):
    return [Sample(index=i, reward=r) for i, r in enumerate(rewards)]


def test_mixed_group_is_kept():
    assert check_reward_nonzero_std(ARGS, group(1.0, 0.0, 0.0)).keep


@pytest.mark.parametrize("rewards, reason", [((1.0, 1.0), "all_correct"), ((0.0, 0.0, 0.0), "all_wrong")])
def test_constant_groups_are_dropped_with_a_reason(rewards, reason):
    assert check_reward_nonzero_std(ARGS, group(*rewards)) == DynamicFilterOutput(False, reason)


def test_dict_rewards_use_reward_key():
    samples = [Sample(index=0, reward={"score": 1.0}), Sample(index=1, reward={"score": -1.0})]
    assert check_reward_nonzero_std(SimpleNamespace(reward_key="score"), samples).keep


def test_plain_bool_results_are_accepted_and_others_rejected():
    assert as_filter_output(True).keep and as_filter_output(False).reason == "filtered"
    with pytest.raises(TypeError, match="--dynamic-sampling-filter-path"):
        as_filter_output(0.5)
