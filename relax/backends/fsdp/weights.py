"""Receiving side of the weight push for a sharded (FSDP2) model: ActorFwd taking the actor's weights.

In fully-async mode the ActorFwd ranks are receivers of the same broadcast group as the
inference engines (SGLang's protocol, `relax.distributed.weight_sync`). Each rank receives
every full tensor from the sender and keeps only its own shard: `distribute_tensor(...,
src_data_rank=None)` splits locally, so loading needs no collective among the ranks and
cannot deadlock against the sender. As on the engines, a well-formed bucket is always
received in full; names or shapes the model does not have reject the bucket (nothing loaded).
"""

from __future__ import annotations

import torch

from relax.distributed.weight_sync import TensorSpec, WeightReceiver, parse_specs


class ShardedWeightReceiver(WeightReceiver):
    """The engine's receiver (`relax.distributed.weight_sync.WeightReceiver`), loading each
    received full tensor as this rank's shard; remembers the last complete version."""

    def __init__(self, model: torch.nn.Module, *, device: torch.device, timeout_s: float = 600.0) -> None:
        super().__init__(model, timeout_s=timeout_s, device=device)
        self.version: int | None = None

    def _targets(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters(remove_duplicate=False))

    def update(self, payload: dict) -> tuple[bool, str]:
        """Blocking: receive one bucket from rank 0 and load this rank's shard of each tensor."""
        specs = parse_specs(payload["names"], payload["dtypes"], payload["shapes"])
        success, message = self.receive_and_load(specs, payload.get("group_name"))
        if success and payload.get("weight_version") is not None:
            self.version = int(payload["weight_version"])
        return success, message

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
