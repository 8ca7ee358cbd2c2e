"""Rollout rows for TransferQueue, from samples or from a custom convert-samples plugin; the data
system's start-up settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from relax.distributed import transfer_queue
from relax.distributed.transfer_queue import samples_to_columns, train_data_to_columns
from relax.types import Sample


def samples():
    return [Sample(index=i, group_index=0, tokens=[1, 2, 3, 4], response_length=2, rollout_log_probs=[-1.0, -2.0],
                   weight_versions=[3]) for i in range(2)]


def test_plugin_columns_replace_the_default_and_missing_keys_keep_it():
    data = {"loss_masks": [[0, 1], [1, 0]], "rewards": [5.0, 6.0], "raw_reward": [0.0, 0.0]}
    cols = train_data_to_columns(data, samples(), [0.1, 0.2])
    assert [m.tolist() for m in cols["loss_masks"]] == [[0, 1], [1, 0]]
    assert cols["rewards"].tolist() == [5.0, 6.0]
    default = samples_to_columns(samples(), [0.1, 0.2])
    assert cols["weight_versions"].tolist() == default["weight_versions"].tolist() == [3, 3]
    assert "raw_reward" not in cols


@pytest.mark.parametrize("data, needle", [
    ([1, 2], "must return a dict"),
    ({"rewards": [1.0]}, "'rewards' has 1 entries for 2 samples"),
    ({"loss_masks": [[1], [1]]}, "len(loss_masks) == len(rollout_log_probs) == response_length"),
])
def test_bad_plugin_output_names_the_flag(data, needle):
    with pytest.raises((TypeError, ValueError), match="--custom-convert-samples-to-train-data-path") as err:
        train_data_to_columns(data, samples(), [0.0, 0.0])
    assert needle in str(err.value)


@pytest.mark.parametrize("units", [1, 3])
def test_num_data_storage_units_is_the_storage_unit_count_transfer_queue_starts(monkeypatch, units):
    started = []
    package = SimpleNamespace(init=lambda conf=None: started.append(conf))  # the `transfer_queue` package
    monkeypatch.setattr(transfer_queue, "_package", lambda: package)
    monkeypatch.setattr(transfer_queue, "running", lambda: False)
    assert transfer_queue.init_data_system(units)
    (conf,) = started
    assert conf.backend.SimpleStorage.num_data_storage_units == units and conf.controller.polling_mode
