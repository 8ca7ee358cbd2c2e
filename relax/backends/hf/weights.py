"""Engine side of SGLang's distributed weight update for the `hf` engine.

`/init_weights_update_group` joins a broadcast group (rank = rank_offset; this engine is one
process on one device) built by `relax.distributed.weight_sync.create_weight_group`.
`/update_weights_from_distributed` lists tensors {names, dtypes, shapes}; the engine receives
each one, in order, from rank 0 into a scratch tensor, then checks the names and shapes
against the model (HF parameter names, tied aliases included) and copies them in under the
model's step lock, so no forward sees half a bucket.

The receive always happens for a well-formed request, even when a name or shape is wrong:
the sender is blocked in the broadcast and must not hang. The bucket is then rejected as a
whole (nothing loaded) with a message naming every bad tensor. A malformed request (unknown
dtype, lists of different lengths, unknown group) is rejected before any receive.
"""

from __future__ import annotations

import logging
import math
import threading

import torch

from relax.distributed.weight_sync import (  # noqa: F401 - re-exported: the engine's request parsing
    DTYPES, MAX_TENSORS_PER_REQUEST, TensorSpec, WeightGroup, create_weight_group, parse_dtype, parse_specs)

logger = logging.getLogger(__name__)

class WeightReceiver:
    """Holds the engine's weight groups and loads received tensors into the model."""

    def __init__(self, model: torch.nn.Module, *, step_lock: threading.Lock, timeout_s: float = 600.0,
                 device: torch.device | str = "cpu"):
        self.model, self.step_lock, self.timeout_s = model, step_lock, timeout_s
        self.device = torch.device(device)
        self.groups: dict[str, WeightGroup] = {}
        # Groups out of step after a request we refused before receiving: the sender may have
        # pushed bytes we never read, so receiving on them again could misparse (and gloo aborts
        # the process on a size mismatch). Kept referenced, never used, until destroyed.
        self.quarantined: dict[str, WeightGroup] = {}

    def init_group(self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
                   group_name: str, backend: str) -> str:
        """Blocking join; returns a message. Raises ValueError for a request that cannot work."""
        if group_name in self.groups or group_name in self.quarantined:
            raise ValueError(f"weight update group {group_name!r} already exists; destroy it first")
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError("backend 'nccl' needs an engine on a CUDA device; use backend 'gloo' on CPU")
        self.groups[group_name] = create_weight_group(
            master_address=master_address, master_port=master_port, rank=rank_offset, world_size=world_size,
            group_name=group_name, backend=backend, timeout_s=self.timeout_s,
            device=self.device if backend == "nccl" else None)
        return f"joined weight update group {group_name!r} as rank {rank_offset} of {world_size}"

    def destroy_group(self, group_name: str) -> str:
        group = self.groups.pop(group_name, None)
        if group is not None:
            group.destroy()
        elif self.quarantined.pop(group_name, None) is None:
            raise ValueError(f"no weight update group named {group_name!r}; known: {sorted(self.groups)}")
        return f"destroyed weight update group {group_name!r}"

    def quarantine(self, group_name: str) -> None:
        if group_name in self.groups:
            self.quarantined[group_name] = self.groups.pop(group_name)

    def group(self, group_name: str) -> WeightGroup:
        if group_name in self.quarantined:
            raise ValueError(f"weight update group {group_name!r} is out of step after a rejected request; "
                             "destroy it and call /init_weights_update_group again")
        if group_name not in self.groups:
            raise ValueError(f"no weight update group named {group_name!r}; call /init_weights_update_group "
                             f"first (known: {sorted(self.groups)})")
        return self.groups[group_name]

    def _targets(self) -> dict[str, torch.Tensor]:
        targets = dict(self.model.named_buffers(remove_duplicate=False))
        targets.update(self.model.named_parameters(remove_duplicate=False))
        return targets

    def problems(self, specs: list[TensorSpec]) -> list[str]:
        """Names the model does not have and shapes that do not match it."""
        targets, found = self._targets(), []
        for spec in specs:
            target = targets.get(spec.name)
            if target is None:
                found.append(f"{spec.name!r} is not a parameter of the model")
            elif tuple(target.shape) != spec.shape:
                found.append(f"{spec.name!r} has shape {list(spec.shape)}, the model has {list(target.shape)}")
        return found

    def receive(self, specs: list[TensorSpec], group: WeightGroup) -> list[torch.Tensor]:
        """Blocking: receive every tensor of the bucket, in order, from rank 0."""
        received = []
        for spec in specs:
            tensor = torch.empty(spec.shape, dtype=spec.dtype, device=group.device)
            group.broadcast(tensor, src=0)
            received.append(tensor)
        group.synchronize()
        return received

    def load(self, specs: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
        targets = self._targets()
        with self.step_lock, torch.no_grad():
            for spec, tensor in zip(specs, tensors):
                targets[spec.name].copy_(tensor)

    def receive_and_load(self, specs: list[TensorSpec], group_name: str) -> tuple[bool, str]:
        """Blocking; returns SGLang's (success, message)."""
        tensors = self.receive(specs, self.group(group_name))
        problems = self.problems(specs)
        if problems:
            return False, f"rejected the bucket of {len(specs)} tensors, nothing loaded: " + "; ".join(problems)
        self.load(specs, tensors)
        nbytes = sum(math.prod(s.shape) * t.element_size() for s, t in zip(specs, tensors))
        return True, f"loaded {len(specs)} tensors ({nbytes} bytes)"
