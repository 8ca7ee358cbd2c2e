"""Receiving side of the weight push for a sharded (FSDP2) model: ActorFwd taking the actor's weights.

In fully-async mode the ActorFwd ranks are receivers of the same broadcast group as the
inference engines (SGLang's protocol, `relax.distributed.weights`). Each rank receives
every full tensor from the sender and keeps only its own shard: `distribute_tensor(...,
src_data_rank=None)` splits locally, so loading needs no collective among the ranks and
cannot deadlock against the sender. As on the engines, a well-formed bucket is always
received in full; names or shapes the model does not have reject the bucket (nothing loaded).
A rank on the actor's GPU takes CUDA IPC handles instead (`load_tensor_payload`, the engine's).
"""

from __future__ import annotations

import torch

from relax.distributed.weights.protocol import TensorSpec
from relax.distributed.weights.receiver import WeightReceiver


class ShardedWeightReceiver(WeightReceiver):
    """The engine's receiver (`relax.distributed.weights.receiver.WeightReceiver`), loading each
    full tensor, received or handed over, as this rank's shard; `version`: the last complete push's."""

    version_type = int

    def __init__(self, model: torch.nn.Module, *, device: torch.device, timeout_s: float = 600.0) -> None:
        super().__init__(model, timeout_s=timeout_s, device=device)

    def _targets(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters(remove_duplicate=False))

    @torch.no_grad()
    def load(self, specs: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = self._bucket_targets()
        for spec, full in zip(specs, tensors):
            p = params[spec.name]
            full = full.to(device=self.device, dtype=p.dtype)
            if isinstance(p, DTensor):
                shard = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                p.to_local().copy_(shard)
            else:
                p.copy_(full)
