"""Receiving side of the weight push for a sharded (FSDP2) model: ActorFwd taking the actor's weights.

In fully-async mode the ActorFwd ranks are receivers of the same broadcast group as the
inference engines (SGLang's protocol, `relax.distributed.weight_sync`). Each rank receives
every full tensor from the sender and keeps only its own shard: `distribute_tensor(...,
src_data_rank=None)` splits locally, so loading needs no collective among the ranks and
cannot deadlock against the sender. As on the engines, a well-formed bucket is always
received in full; names or shapes the model does not have reject the bucket (nothing loaded).
"""

from __future__ import annotations

import math

import torch

from relax.distributed.weight_sync import TensorSpec, WeightGroup, create_weight_group, parse_specs


class ShardedWeightReceiver:
    def __init__(self, model: torch.nn.Module, *, device: torch.device, timeout_s: float = 600.0) -> None:
        self.model, self.device, self.timeout_s = model, device, timeout_s
        self.groups: dict[str, WeightGroup] = {}
        self.version: int | None = None

    def init_group(self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
                   group_name: str, backend: str) -> str:
        if group_name in self.groups:
            raise ValueError(f"weight update group {group_name!r} already exists; destroy it first")
        self.groups[group_name] = create_weight_group(
            master_address=master_address, master_port=master_port, rank=rank_offset, world_size=world_size,
            group_name=group_name, backend=backend, timeout_s=self.timeout_s,
            device=self.device if backend == "nccl" else None)
        return f"joined weight update group {group_name!r} as rank {rank_offset} of {world_size}"

    def destroy_group(self, group_name: str) -> str:
        group = self.groups.pop(group_name, None)
        if group is None:
            raise ValueError(f"no weight update group named {group_name!r}; known: {sorted(self.groups)}")
        group.destroy()
        return f"destroyed weight update group {group_name!r}"

    def problems(self, specs: list[TensorSpec]) -> list[str]:
        params, found = dict(self.model.named_parameters(remove_duplicate=False)), []
        for spec in specs:
            p = params.get(spec.name)
            if p is None:
                found.append(f"{spec.name!r} is not a parameter of the model")
            elif tuple(p.shape) != spec.shape:
                found.append(f"{spec.name!r} has shape {list(spec.shape)}, the model has {list(p.shape)}")
        return found

    def update(self, payload: dict) -> tuple[bool, str]:
        """Blocking: receive one bucket from rank 0 and load this rank's shard of each tensor."""
        name = payload.get("group_name")
        if name not in self.groups:
            raise ValueError(f"no weight update group named {name!r}; init it first (known: {sorted(self.groups)})")
        specs = parse_specs(payload["names"], payload["dtypes"], payload["shapes"])
        group = self.groups[name]
        tensors = []
        for spec in specs:
            tensor = torch.empty(spec.shape, dtype=spec.dtype, device=group.device)
            group.broadcast(tensor, src=0)
            tensors.append(tensor)
        group.synchronize()
        problems = self.problems(specs)
        if problems:
            return False, f"rejected the bucket of {len(specs)} tensors, nothing loaded: " + "; ".join(problems)
        self.load(specs, tensors)
        if payload.get("weight_version") is not None:
            self.version = int(payload["weight_version"])
        nbytes = sum(math.prod(s.shape) * t.element_size() for s, t in zip(specs, tensors))
        return True, f"loaded {len(specs)} tensors ({nbytes} bytes)"

    @torch.no_grad()
    def load(self, specs: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = dict(self.model.named_parameters(remove_duplicate=False))
        for spec, full in zip(specs, tensors):
            p = params[spec.name]
            full = full.to(device=self.device, dtype=p.dtype)
            if isinstance(p, DTensor):
                shard = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                p.to_local().copy_(shard)
            else:
                p.copy_(full)
