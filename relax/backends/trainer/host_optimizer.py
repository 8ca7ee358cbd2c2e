"""`--optimizer-cpu-offload`: the optimizer's state and its step on the host, as megatron's
`HybridDeviceOptimizer` does (with its offload fraction at 1).

The optimized parameters stay on the device, where the model computes with them. `HostOptimizer`
keeps a float32 copy of each (its local shard under FSDP2) in pinned host memory and an inner
torch optimizer over those copies (AdamW, SGD, or the precision-aware AdamW of `lowp_adam.py`), so
Adam's moments and step counts never take device memory. A step:

    gradients device -> host (pinned buffers, allocated once)
    the inner optimizer steps the host copies (on the CPU cores; torch's fused CPU AdamW)
    updated copies host -> device, into the parameters

`--overlap-cpu-optimizer-d2h-h2d`: the parameters are cut into chunks of `CHUNK_BYTES` (float32),
each with its own inner optimizer. Every chunk's gradient copy is queued at once on a side CUDA
stream with an event per chunk; the host steps chunk i as soon as its event fires, while the DMA
engine copies chunks i+1.. down, and chunk i's weights go back up on a second side stream while
chunk i+1 steps. Without the flag: one chunk, copies on the current stream, then the step.
On a CPU the "device" is the host: the copies are plain copies (no pinned memory, no streams) and
the chunked schedule still runs (`last_schedule` records it; the tests check it there).

With ZeRO-1 (`--use-distributed-optimizer`) torch's `ZeroRedundancyOptimizer` builds one
`HostOptimizer` over this rank's shard: each rank offloads and steps only its share, then ZeRO
broadcasts the updated parameters as it does for any optimizer.

Checkpoints see torch's optimizer format keyed by the device parameters (`state_dict` /
`load_state_dict`), so the runners' checkpoint code is unchanged; state tensors stay on the host
(under FSDP2 presented as DTensors of the parameter's layout, so DCP saves every rank's shard).
After the parameters change outside the optimizer (a checkpoint load), `refresh_host_copies`
takes the new values.
"""

from __future__ import annotations

import contextlib
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch

from relax.backends.trainer.lowp_adam import closure_loss

CHUNK_BYTES = 64 << 20  # float32 bytes per chunk under --overlap-cpu-optimizer-d2h-h2d


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: an FSDP2 DTensor's local shard, else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def chunk_plan(nbytes: list[int], chunk_bytes: int) -> list[list[int]]:
    """Consecutive indices of tensors of `nbytes` grouped into chunks of at most `chunk_bytes`
    (a tensor larger than that is a chunk of its own)."""
    chunks: list[list[int]] = []
    size = 0
    for i, n in enumerate(nbytes):
        if chunks and size + n <= chunk_bytes:
            chunks[-1].append(i)
            size += n
        else:
            chunks.append([i])
            size = n
    return chunks


class Copier:
    """Where a step's copies run. On a GPU: into and out of pinned memory, on two side streams
    (device->host, host->device) with --overlap-cpu-optimizer-d2h-h2d, else on the current
    stream; the host waits for a chunk's gradients by its event. On a CPU: plain copies."""

    def __init__(self, device: torch.device, overlap: bool) -> None:
        self.cuda = device.type == "cuda"
        self.d2h = torch.cuda.Stream(device) if self.cuda and overlap else None
        self.h2d = torch.cuda.Stream(device) if self.cuda and overlap else None

    def _on(self, side: Any) -> Any:
        if side is None:
            return contextlib.nullcontext()
        side.wait_stream(torch.cuda.current_stream(side.device))  # what it copies is ready there
        return torch.cuda.stream(side)

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], side: Any) -> Any:
        with self._on(side):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=self.cuda)
            return torch.cuda.current_stream().record_event() if self.cuda else None

    def to_host(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """(host, device) pairs copied down; returns the event the host waits for (None on a CPU)."""
        return self._copy(pairs, self.d2h)

    def to_device(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """(device, host) pairs copied up, after what the current stream has queued."""
        self._copy(pairs, self.h2d)

    @staticmethod
    def wait(event: Any) -> None:
        if event is not None:
            event.synchronize()

    def finish(self) -> None:
        """The current stream's later work (the next forward) runs after the copies up."""
        if self.h2d is not None:
            torch.cuda.current_stream(self.h2d.device).wait_stream(self.h2d)


@dataclass
class HostChunk:
    """Some of one parameter group's parameters, their host copies and the optimizer stepping them."""

    group: int  # index into the outer optimizer's param_groups
    params: list[torch.Tensor]  # the device parameters
    hosts: list[torch.Tensor]  # their float32 host copies, the inner optimizer's parameters
    inner: torch.optim.Optimizer
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> host gradient buffer


class HostState(MutableMapping):
    """The optimizer state keyed by the device parameters (torch's layout), held by the chunks'
    inner optimizers under their host copies."""

    def __init__(self, slots: dict[torch.Tensor, tuple[torch.optim.Optimizer, torch.Tensor]]) -> None:
        self.slots = slots

    def __getitem__(self, p: torch.Tensor) -> dict[str, Any]:
        inner, host = self.slots[p]
        if host not in inner.state:
            raise KeyError("no optimizer state for this parameter yet")
        return inner.state[host]

    def __setitem__(self, p: torch.Tensor, value: dict[str, Any]) -> None:
        inner, host = self.slots[p]
        inner.state[host] = value

    def __delitem__(self, p: torch.Tensor) -> None:
        inner, host = self.slots[p]
        del inner.state[host]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (p for p, (inner, host) in self.slots.items() if host in inner.state)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class HostOptimizer(torch.optim.Optimizer):
    """`HostOptimizer(params, inner=AdamW, overlap=False, **inner_kwargs)`: see the module doc.
    Subclasses `torch.optim.Optimizer` because the LR scheduler and ZeRO-1 require one; the LR
    schedule edits `param_groups`, which each step hands to the inner optimizers."""

    def __init__(self, params: Iterable[Any], *, inner: Callable[..., torch.optim.Optimizer], overlap: bool = False,
                 chunk_bytes: int = CHUNK_BYTES, **defaults: Any) -> None:
        super().__init__(params, defaults)
        first = next((p for g in self.param_groups for p in g["params"]), None)
        self.device = local_tensor(first).device if first is not None else torch.device("cpu")
        self.copier = Copier(self.device, overlap)
        self.chunks: list[HostChunk] = []
        for gi, group in enumerate(self.param_groups):
            hosts = [self._host_copy(p) for p in group["params"]]
            plan = chunk_plan([h.nbytes for h in hosts], chunk_bytes) if overlap else [list(range(len(hosts)))]
            for idx in filter(None, plan):
                chunk_hosts = [hosts[i] for i in idx]
                self.chunks.append(HostChunk(gi, [group["params"][i] for i in idx], chunk_hosts,
                                             inner([{**self._hyper(gi), "params": chunk_hosts}])))
        self._slots = {p: (c.inner, h) for c in self.chunks for p, h in zip(c.params, c.hosts)}
        self.last_schedule: list[tuple[str, int]] = []  # the last step's copies and steps, in order

    @property
    def state(self) -> HostState:  # type: ignore[override]
        return HostState(getattr(self, "_slots", {}))

    @state.setter
    def state(self, value: Any) -> None:
        if value:  # torch.optim.Optimizer.__init__ assigns an empty dict; a load goes through load_state_dict
            raise TypeError("HostOptimizer's state lives in its host chunks; set it with load_state_dict")

    def _host_copy(self, p: torch.Tensor) -> torch.Tensor:
        host = local_tensor(p).detach().to("cpu", torch.float32, copy=True)
        return host.pin_memory() if self.device.type == "cuda" else host

    def _hyper(self, group: int) -> dict[str, Any]:
        return {k: v for k, v in self.param_groups[group].items() if k != "params"}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure_loss(closure)
        self.last_schedule = []
        events = []
        for i, chunk in enumerate(self.chunks):  # every chunk's gradients queued at once
            events.append(self.copier.to_host(self._grad_pairs(chunk)))
            self.last_schedule.append(("d2h", i))
        for i, (chunk, event) in enumerate(zip(self.chunks, events)):
            self.copier.wait(event)
            chunk.inner.param_groups[0].update(self._hyper(chunk.group))
            chunk.inner.step()
            self.last_schedule.append(("step", i))
            self.copier.to_device([(local_tensor(p), h) for p, h in zip(chunk.params, chunk.hosts)
                                   if h.grad is not None])
            self.last_schedule.append(("h2d", i))
        self.copier.finish()
        return loss

    def _grad_pairs(self, chunk: HostChunk) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(host buffer, device gradient) of every parameter with a gradient; the host copies of
        the others get none (the inner optimizer skips them, as torch's skip a missing gradient)."""
        pairs = []
        for k, (p, host) in enumerate(zip(chunk.params, chunk.hosts)):
            if p.grad is None:
                host.grad = None
                continue
            if k not in chunk.grads:
                chunk.grads[k] = torch.empty_like(host).pin_memory() if self.copier.cuda else torch.empty_like(host)
            host.grad = chunk.grads[k]
            pairs.append((host.grad, local_tensor(p.grad)))
        return pairs

    @torch.no_grad()
    def refresh_host_copies(self) -> None:
        """The device parameters changed outside the optimizer (a checkpoint load): copy them down."""
        for chunk in self.chunks:
            for p, host in zip(chunk.params, chunk.hosts):
                host.copy_(local_tensor(p))

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        sd["state"] = {i: {k: _in_layout_of(params[i], v) for k, v in s.items()} for i, s in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's format: the saved groups' parameter keys (positions, or DCP's names) map onto
        this optimizer's parameters in order, as `torch.optim.Optimizer.load_state_dict` maps them;
        tensors land on the host in their saved dtypes (bf16 moments stay bf16), and the host
        copies take the device values."""
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the optimizer state was saved for other parameters (group sizes differ); resume "
                             "with the model and --only-train/--freeze flags it was saved with")
        keys = {k: p for saved, group in zip(saved_groups, self.param_groups)
                for k, p in zip(saved["params"], group["params"])}
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state.clear()
        for key, saved in state_dict["state"].items():
            self.state[keys[key]] = {k: _on_host(v) for k, v in saved.items()}
        self.refresh_host_copies()


def _in_layout_of(p: torch.Tensor, value: Any) -> Any:
    """A host state tensor of a DTensor parameter as a DTensor of the same layout (DCP saves each
    rank's shard of it); scalars (the step count) and plain parameters' state as they are."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or not hasattr(p, "device_mesh"):
        return value
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(value, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


def _on_host(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return local_tensor(value).detach().to("cpu", copy=True)


def host_optimizers(optimizer: Any) -> list[HostOptimizer]:
    """The HostOptimizer behind `optimizer` (itself, or ZeRO-1's local one), as a list (empty without offload)."""
    local = getattr(optimizer, "optim", optimizer)
    return [local] if isinstance(local, HostOptimizer) else []
