"""Rank 0's push with --check-weight-update-equal (`WeightPush(check=True)`): each lane's engines are
checked after the push, with the tensors that went out; a mismatch fails the push."""

from __future__ import annotations

import pytest
import torch

from relax.backends.trainer.weights_out import WeightPush
from relax.distributed.weights.check import WeightMismatch
from relax.distributed.weights.protocol import SyncStats
from relax.distributed.weights.sender import WeightSender


class Engine:
    """An hf engine's /weights_checker that holds `held` (checksums by name)."""

    def __init__(self, held: dict[str, str]) -> None:
        self.held, self.asked = held, []

    async def features(self) -> frozenset[str]:
        return frozenset({"weights_checker_by_name"})

    async def post(self, path: str, payload: dict, timeout_s: float) -> dict:
        self.asked.append((path, payload["names"]))
        return {"success": True, "checksums": self.held, "dtypes": {n: "float32" for n in self.held}}


def _sender(engine: Engine) -> WeightSender:
    sender = WeightSender.__new__(WeightSender)  # the broadcast itself is test_sender.py's business
    sender.receivers = [engine]

    async def push(named, *, version):
        return SyncStats(bytes=4, seconds=0.1, gbps=0.0, num_buckets=1, version=version)

    sender.push = push
    return sender


def test_each_push_is_checked_on_the_engines_it_went_to():
    from relax.distributed.weights.checksums import tensor_checksum

    w = torch.ones(1)
    good, bad = Engine({"w": tensor_checksum(w)}), Engine({"w": tensor_checksum(w * 2)})
    push = WeightPush(device=torch.device("cpu"), backend="gloo", bucket_bytes=1 << 20, timeout_s=30, check=True)
    try:
        push.senders[1] = _sender(good)
        metrics = push.push([("w", w, False)], 1, [1], background=False)
        assert good.asked == [("/weights_checker", ["w"])] and metrics["weight_sync/checked_engines"] == 1.0
        push.senders[1] = _sender(bad)
        with pytest.raises(WeightMismatch, match="'w' differs"):
            push.push([("w", w, False)], 2, [1], background=False)
    finally:
        push.senders.clear()
        push.close()
    unchecked = WeightPush(device=torch.device("cpu"), backend="gloo", bucket_bytes=1 << 20, timeout_s=30)
    assert unchecked.check is None
