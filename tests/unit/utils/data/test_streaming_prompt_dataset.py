"""StreamingPromptDataset: lazy order, shuffle buffer, epochs and save/restore of the position."""

from __future__ import annotations

import pytest
from prompt_data_helpers import numbered_rows, write_jsonl, write_parquet

from relax.utils.data import DataError, StreamingPromptDataset


def labels(samples):
    return [s.label for s in samples]


def test_unshuffled_stream_follows_file_order_and_wraps_epochs(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(5))
    dataset = StreamingPromptDataset(str(path), label_key="label")
    assert len(dataset) == 5
    assert labels(dataset.take(3)) == ["0", "1", "2"]
    assert labels(dataset.take(4)) == ["3", "4", "0", "1"]
    assert dataset.epoch == 1 and dataset.position == 2


def test_shuffled_stream_is_a_seeded_permutation_per_epoch(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(30))

    def epochs(seed):
        dataset = StreamingPromptDataset(str(path), label_key="label", shuffle=True, buffer_size=8, seed=seed)
        return labels(dataset.take(30)), labels(dataset.take(30))

    first, second = epochs(seed=7)
    assert sorted(first, key=int) == [str(i) for i in range(30)]
    assert sorted(second, key=int) == [str(i) for i in range(30)]
    assert first != second
    assert first != [str(i) for i in range(30)]
    assert epochs(seed=7) == (first, second)
    assert epochs(seed=8)[0] != first


def test_small_shuffle_buffer_keeps_rows_near_their_file_position(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(40))
    dataset = StreamingPromptDataset(str(path), label_key="label", shuffle=True, buffer_size=4, seed=0)
    order = [int(label) for label in labels(dataset.take(40))]
    # An item leaves the buffer only after it entered: the k-th emitted row is at most k + buffer_size - 1.
    assert all(row <= k + 3 for k, row in enumerate(order[:36]))


def test_restored_stream_continues_with_the_same_samples(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", numbered_rows(9))
    b = write_parquet(tmp_path / "b.parquet", [{"input": f"p{i}", "label": f"p{i}"} for i in range(4)])
    kwargs = dict(label_key="label", shuffle=True, buffer_size=5, seed=3)
    original = StreamingPromptDataset([str(a), str(b)], **kwargs)
    original.take(17)  # into the second epoch
    state = original.state_dict()
    restored = StreamingPromptDataset([str(a), str(b)], **kwargs)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert labels(restored.take(20)) == labels(original.take(20))


def test_stream_skips_malformed_rows_when_asked_and_raises_otherwise(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "a"}, "{bad", {"input": "b"}])
    dataset = StreamingPromptDataset(str(path), skip_malformed=True)
    assert [s.prompt for s in dataset.take(2)] == ["a", "b"]
    assert dataset.num_skipped == 1
    with pytest.raises(DataError, match=r"d\.jsonl \(line 2\)"):
        StreamingPromptDataset(str(path)).take(2)


def test_stream_with_no_usable_rows_raises_instead_of_looping(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["{bad", "{worse"])
    with pytest.raises(ValueError, match="no usable prompts"):
        StreamingPromptDataset(str(path), skip_malformed=True).take(1)


def test_stream_checks_files_exist_up_front(tmp_path):
    with pytest.raises(FileNotFoundError, match="--prompt-data"):
        StreamingPromptDataset(str(tmp_path / "missing.jsonl"))
