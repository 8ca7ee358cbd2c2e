"""CUDA IPC weight payloads: SGLang's encoding, and a receiver that unpickles nothing but tensor
rebuilds (the payload arrives over HTTP, so an arbitrary pickle would be remote code execution)."""

from __future__ import annotations

import base64
import os
import pickle

import pytest
import torch

from relax.distributed.weights.ipc import (
    UnsafePayload, deserialize, flatten_bucket, named_tensors, serialize, unflatten_bucket,
)


class _Exploit:
    def __reduce__(self):
        return os.system, ("echo pwned > /dev/null",)


def test_a_payload_naming_any_other_callable_is_refused_with_its_name():
    text = base64.b64encode(pickle.dumps([("w", _Exploit())])).decode()
    with pytest.raises(UnsafePayload, match=r"names posix\.system"):
        deserialize(text)


def test_cpu_tensors_are_refused_they_would_travel_as_file_descriptors_not_ipc_handles():
    with pytest.raises(UnsafePayload, match="not a CUDA tensor rebuild"):
        deserialize(serialize([("w", torch.ones(2))]))


def test_plain_containers_and_names_round_trip_and_the_shape_is_checked():
    assert deserialize(serialize([("a", 1)])) == [("a", 1)]  # containers only: allowed
    with pytest.raises(ValueError, match=r"list of \(name, tensor\) pairs"):
        named_tensors([("a", 1)])
    with pytest.raises(ValueError, match="not base64"):
        deserialize("%%%")


def test_a_handle_names_its_gpu_by_uuid_and_the_receiver_maps_it_to_its_own_index(monkeypatch):
    """An index means another GPU under another CUDA_VISIBLE_DEVICES; a UUID means one GPU everywhere."""
    from torch.multiprocessing import reductions

    from relax.distributed.weights import ipc

    uuids = {0: "GPU-aaaa", 1: "GPU-bbbb"}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(ipc, "device_uuid", uuids.__getitem__)
    seen = []
    monkeypatch.setattr(reductions, "rebuild_cuda_tensor", lambda *args: seen.append(args) or "tensor")
    args = tuple(range(ipc.DEVICE_ARG)) + ("GPU-bbbb", "rest")
    assert ipc._rebuild_cuda_tensor(*args) == "tensor"
    assert seen[0][ipc.DEVICE_ARG] == 1 and seen[0][-1] == "rest"
    assert ipc.local_device(0) == 0  # an index (an older sender) is taken as it is
    with pytest.raises(ValueError, match="GPU-cccc, which this process does not see"):
        ipc.local_device("GPU-cccc")


def test_a_flattened_bucket_is_one_tensor_whose_views_are_the_named_tensors():
    """One tensor (one IPC handle) per bucket; the metadata round-trips through the safe unpickler
    (here without the tensor: CPU tensors are refused) and rebuilds views of the right spans."""
    named = [("a", torch.arange(6, dtype=torch.bfloat16).view(2, 3)), ("b", torch.ones(4, dtype=torch.bfloat16))]
    bucket = flatten_bucket(named)
    assert bucket["flattened_tensor"].shape == (10,)
    metadata = deserialize(serialize(bucket["metadata"]))  # SimpleNamespace: attributes only, allowed
    back = unflatten_bucket({"flattened_tensor": bucket["flattened_tensor"], "metadata": metadata})
    assert [n for n, _ in back] == ["a", "b"]
    assert all(torch.equal(got, want) for (_, got), (_, want) in zip(back, named))
    assert back[0][1].data_ptr() == bucket["flattened_tensor"].data_ptr()  # views, no copy
    assert flatten_bucket([("a", torch.ones(2)), ("b", torch.ones(2, dtype=torch.bfloat16))]) is None  # mixed


@pytest.mark.parametrize("change,message", [
    ({"end_idx": 11}, "does not fit"), ({"numel": 5}, "does not fit"), ({"shape": (3, 3)}, "does not fit"),
    ({"dtype": torch.float32}, "does not fit"), ({"name": 7}, "entry 0"), ({"start_idx": -1}, "does not fit")])
def test_a_flattened_bucket_whose_metadata_does_not_fit_is_refused_naming_the_entry(change, message):
    bf16 = torch.bfloat16
    bucket = flatten_bucket([("a", torch.zeros(2, 3, dtype=bf16)), ("b", torch.zeros(4, dtype=bf16))])
    meta = [vars(m) for m in bucket["metadata"]]  # dicts are read too (SGLang accepts both)
    meta[0] = {**meta[0], **change}
    with pytest.raises(ValueError, match=message):
        unflatten_bucket({"flattened_tensor": bucket["flattened_tensor"], "metadata": meta})
    with pytest.raises(ValueError, match="must be"):
        unflatten_bucket([("a", torch.zeros(2))])
