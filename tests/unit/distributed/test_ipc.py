"""CUDA IPC weight payloads: SGLang's encoding, and a receiver that unpickles nothing but tensor
rebuilds (the payload arrives over HTTP, so an arbitrary pickle would be remote code execution)."""

from __future__ import annotations

import base64
import os
import pickle

import pytest
import torch

from relax.distributed.ipc import UnsafePayload, deserialize, named_tensors, serialize


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

    from relax.distributed import ipc

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
