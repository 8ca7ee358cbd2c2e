"""The pure decisions of the scaling operations: what a half-failed scale-out keeps, which engines a
scale-in drains, and what a request's count means."""

from __future__ import annotations

import pytest

from relax.engine.elastic.operations import ScalingError
from relax.engine.elastic.policies import PARTIAL_SUCCESS, pick_victims, scale_in_count, scale_out_count


def engine(i, protected=False, state="active"):
    return {"id": f"engine-{i}", "address": f"http://h:{i}", "protected": protected, "state": state}


FLEET = [engine(0, protected=True), engine(1), engine(2), engine(3, state="joining")]


def test_partial_success_policies():
    assert PARTIAL_SUCCESS["rollback_all"](["a", "b"], []) == ["a", "b"]
    assert PARTIAL_SUCCESS["rollback_all"](["a"], ["boom"]) == []
    assert PARTIAL_SUCCESS["keep_partial"](["a"], ["boom"]) == ["a"]
    assert PARTIAL_SUCCESS["keep_partial"]([], ["boom"]) == []


def test_counts_from_a_request():
    assert scale_out_count({"num_engines": 2}, FLEET) == 2
    assert scale_out_count({"target_engines": 6}, FLEET) == 2  # 4 engines (a joining one included)
    assert scale_out_count({"target_engines": 1}, FLEET) == 0
    assert scale_in_count({"target_engines": 1}, FLEET) == 2  # 3 active
    assert scale_in_count({"num_engines": 1}, FLEET) == 1


def test_victims_are_the_newest_unprotected_active_engines_never_the_last():
    assert [v["id"] for v in pick_victims(FLEET, 2)] == ["engine-2", "engine-1"]
    assert [v["id"] for v in pick_victims(FLEET, named=["http://h:1"])] == ["engine-1"]
    for count, named, status, words in ((3, None, 409, "only 2 engine(s) can be scaled in"),
                                        (0, ["engine-0"], 409, "protected"),
                                        (0, ["engine-3"], 409, "not active"),
                                        (0, ["engine-9"], 404, "no engine ['engine-9']")):
        with pytest.raises(ScalingError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) \
                as err:
            pick_victims(FLEET, count, named)
        assert err.value.status == status
    with pytest.raises(ScalingError, match="leave none"):
        pick_victims([engine(1), engine(2)], 2)
