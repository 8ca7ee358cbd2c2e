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


# ---- the column schema and TrainBatch ---------------------------------------------------------

from relax.types import COLUMNS, ROLLOUT_COLUMNS, TrainBatch  # noqa: E402


def test_every_column_has_a_dtype_a_shape_and_a_trainbatch_field_when_trained_on():
    assert set(ROLLOUT_COLUMNS) <= set(COLUMNS)
    fields = set(TrainBatch.__dataclass_fields__)
    for col in COLUMNS.values():
        assert col.dtype in ("int64", "float32", "uint8") and col.shape in ("R", "RT", "RL", "RB") and col.doc
        assert (col.dtype == "uint8") == (col.shape == "RB")  # bytes per row: the media column
        assert col.ragged == (col.shape != "R")
    assert {c.field for c in COLUMNS.values()} - fields == {"group_indices_R", "weight_versions_R", "truncated_R",
                                                             "episode_rows_R"}


def test_train_batch_from_columns_rows_and_put():
    batch = TrainBatch.from_columns({"tokens": [[1, 2, 3], [4, 5]], "response_lengths": [2, 1],
                                     "loss_masks": [[1, 1], [1]], "rewards": [1.0, 0.0], "group_indices": [0, 0]})
    assert batch.tokens_RL == [[1, 2, 3], [4, 5]] and batch.rewards_R == [1.0, 0.0] and len(batch) == 2
    assert batch.present() == ["tokens_RL", "response_lengths_R", "loss_masks_RT", "rewards_R"]
    second = batch.rows([1])
    assert second.tokens_RL == [[4, 5]] and second.advantages_RT is None
    second.advantages_RT = [[0.5]]
    target = TrainBatch.empty(2, ["advantages_RT"])
    target.put([1], second)
    assert target.tokens_RL == [None, [4, 5]] and target.advantages_RT == [None, [0.5]]
    with pytest.raises(KeyError):
        TrainBatch.from_columns({"log_probs": [[0.0]]})  # not a column: one name per quantity


def test_train_batch_columns_round_trip():
    batch = TrainBatch(tokens_RL=[[1, 2]], response_lengths_R=[1], loss_masks_RT=[[1]], advantages_RT=[[0.5]])
    assert batch.to_columns() == {"tokens": [[1, 2]], "response_lengths": [1], "loss_masks": [[1]],
                                  "advantages": [[0.5]]}
    assert TrainBatch.from_columns(batch.to_columns()) == batch
