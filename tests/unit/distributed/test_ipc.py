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
