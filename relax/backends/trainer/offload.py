"""Colocate offload: a training rank's GPU state to pinned host memory and back, at bus speed.

While the engines generate on a shared GPU, the trainer's weights and optimizer state wait in
host memory. `module.to("cpu")` did this at ~2 GB/s (5 s a step for a 0.6B model's float32 state):
it allocates pageable host memory every time and copies synchronously. `HostStash` instead:

- moves only what must: gradients are dropped (the next step's `zero_grad(set_to_none=True)`
  would discard them anyway), weights and optimizer state move;
- works on storages, not tensors: each distinct GPU storage is copied byte for byte into a pinned
  host buffer allocated once and reused every step, then resized to 0 bytes (its memory returns
  to the caching allocator); on the way back it is resized and refilled in place. Every tensor
  object (parameters, FSDP2's local shards, the optimizer's state and its keys, views and tied
  weights sharing a storage) stays the same object, so nothing needs re-wiring;
- copies on a side stream with `non_blocking` copies from and into pinned memory, which run at
  PCIe / NVLink-C2C speed, and waits once at the end.

On a CPU (no pinned memory, nothing to free) the same bookkeeping runs with plain host buffers;
the trainer only offloads on GPUs.

The buffers stay allocated while the state is back on the GPU (the next offload allocates no pinned
memory). `keep_buffers=False` (--disable-weights-backuper) frees them after each onload
instead: no host memory is held while the ranks train, and each offload allocates them again.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class HostStash:
    """Pinned host copies of a set of GPU storages, reused across offloads."""

    def __init__(self, keep_buffers: bool = True) -> None:
        self.keep_buffers = keep_buffers  # False: the buffers are freed after each onload
        self.hosts: dict[int, torch.Tensor] = {}  # storage key -> its host buffer (bytes)
        self.stashed: list[tuple[torch.UntypedStorage, torch.Tensor, int]] = []  # (storage, host, nbytes)

    @staticmethod
    def storages(tensors: Iterable[torch.Tensor], device: torch.device) -> list[torch.UntypedStorage]:
        """The distinct non-empty storages on `device` behind `tensors`, in first-seen order
        (others, such as a non-fused optimizer's step counters on the host, stay where they are)."""
        seen: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            storage = t.untyped_storage()
            if storage.device == device and storage.nbytes() and storage.data_ptr() not in seen:
                seen[storage.data_ptr()] = storage
        return list(seen.values())

    def _host(self, key: int, nbytes: int, pin: bool) -> torch.Tensor:
        host = self.hosts.get(key)
        if host is None or host.numel() != nbytes:
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            self.hosts[key] = host
        return host

    @torch.no_grad()
    def offload(self, tensors: Iterable[torch.Tensor], device: torch.device) -> int:
        """Copy every storage on `device` behind `tensors` to its host buffer, then free it;
        returns the bytes moved."""
        if self.stashed:
            raise RuntimeError("offload while the state is already on the host; onload first")
        storages = self.storages(tensors, torch.device(device))
        cuda = torch.device(device).type == "cuda"
        stream = torch.cuda.Stream(device) if cuda else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for i, storage in enumerate(storages):
                host = self._host(i, storage.nbytes(), pin=cuda)
                host.copy_(_byte_view(storage), non_blocking=cuda)
                self.stashed.append((storage, host, storage.nbytes()))
        if stream is not None:
            stream.synchronize()
        for storage, _, _ in self.stashed:
            storage.resize_(0)
        return sum(n for _, _, n in self.stashed)

    @torch.no_grad()
    def onload(self) -> int:
        """Give every stashed storage its memory back and refill it; returns the bytes moved."""
        stashed, self.stashed = self.stashed, []
        if not stashed:
            return 0
        device = stashed[0][0].device
        cuda = device.type == "cuda"
        for storage, _, nbytes in stashed:
            storage.resize_(nbytes)
        stream = torch.cuda.Stream(device) if cuda else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for storage, host, _ in stashed:
                _byte_view(storage).copy_(host, non_blocking=cuda)
        if stream is not None:
            stream.synchronize()
        if not self.keep_buffers:
            self.hosts.clear()  # (the buffers go with `stashed`, the last reference, on return)
        return sum(n for _, _, n in stashed)

