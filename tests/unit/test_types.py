"""Sample: seed field names, status mapping, dict round trip, reward access."""

import pytest

from relax.types import FINISH_REASON_STATUS, Sample
from relax.utils.types import Sample as CompatSample


def test_compat_import_path_is_the_same_class():
    assert CompatSample is Sample


def test_round_trip_through_dict_keeps_every_field():
    s = Sample(group_index=1, index=7, prompt=[{"role": "user", "content": "hi"}], tokens=[1, 2, 3],
               response="x", response_length=1, label="2", reward={"score": 1.0}, loss_mask=[1],
               weight_versions=[3], rollout_log_probs=[-0.5], status=Sample.Status.TRUNCATED, metadata={"a": 1})
    d = s.to_dict()
    assert d["status"] == "truncated"
    assert Sample.from_dict(d) == s


def test_from_dict_rejects_unknown_fields_by_name():
    with pytest.raises(ValueError, match="bogus"):
        Sample.from_dict({"bogus": 1})


def test_finish_reasons_map_to_statuses():
    assert FINISH_REASON_STATUS == {"stop": Sample.Status.COMPLETED, "length": Sample.Status.TRUNCATED,
                                    "abort": Sample.Status.ABORTED}


def test_dict_reward_needs_reward_key():
    s = Sample(index=0, reward={"score": 0.5, "acc": True})
    assert s.get_reward_value("score") == 0.5
    with pytest.raises(ValueError, match="--reward-key"):
        s.get_reward_value(None)
    with pytest.raises(KeyError, match="'nope'"):
        s.get_reward_value("nope")
