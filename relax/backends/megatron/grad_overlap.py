"""`--overlap-grad-reduce`: data-parallel gradient all-reduces launched during the step's last
backward, bucket by bucket, instead of all after it (megatron-core DDP's overlapped grad reduce).

Without the flag `grads.reduce` all-reduces every gradient once the last micro-batch's backward
is over. With it, the weights whose gradient is a plain data-parallel mean (`grads.dense_mean`:
not experts, not a tied embedding across pipeline stages, not the norms whose gradients are
partial over the tensor group, not a vision-language model's encoders, which one rank's rows may
not reach) are grouped into buckets of about `BUCKET_NUMEL` elements in reverse parameter order
(the order backward finishes them). A post-accumulate-grad hook on each weight marks it done in
the armed backward (the step's last micro-batch: `arm(last)` before each backward of the
one-stage schedule; megatron-core's pipeline schedule calls `no_sync` around the others). A
bucket whose weights are all done is flattened and all-reduced asynchronously while backward
goes on; buckets launch strictly in order, so every rank issues the same collectives in the same
order. `finish()` (the optimizer step's gradient reduction) launches any bucket backward did not
complete (a weight no micro-batch of this rank reached contributes zeros, so every rank issues
every bucket), waits, divides by the data-parallel size and writes the means back into the
gradients; `grads.reduce` then skips those weights. `last_step` says how many buckets launched
during backward and how many in all.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

BUCKET_NUMEL = 40_000_000  # megatron-core's default DDP bucket size (elements)


@dataclass
class Bucket:
    indices: list[int]  # positions in the overlap's entries
    targets: list[torch.Tensor]  # the tensors whose .grad is reduced (float32 main weights under --bf16)


def bucket_plan(numels: list[int], bucket_numel: int) -> list[list[int]]:
    """Indices of tensors of `numels`, last first, grouped into buckets of at most `bucket_numel`
    elements (a larger tensor is a bucket of its own)."""
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(numels))):
        if buckets and size + numels[i] <= bucket_numel:
            buckets[-1].append(i)
            size += numels[i]
        else:
            buckets.append([i])
            size = numels[i]
    return buckets


class GradOverlap:
    """`GradOverlap(entries, group, divisor)`: `entries` are (weight the hook sits on, tensor whose
    gradient is reduced) in parameter order; the gradients are averaged over `group` (sum, then
    divided by `divisor`)."""

    def __init__(self, entries: list[tuple[torch.Tensor, torch.Tensor]], group: Any, divisor: int,
                 bucket_numel: int = BUCKET_NUMEL) -> None:
        self.group, self.divisor = group, divisor
        targets = [target for _, target in entries]
        self.buckets = [Bucket(idx, [targets[i] for i in idx])
                        for idx in bucket_plan([t.numel() for t in targets], bucket_numel)]
        for i, (weight, _) in enumerate(entries):
            weight.register_post_accumulate_grad_hook(functools.partial(self._done, i))
        self.armed = True
        self.last_step = (0, 0)  # (buckets launched during backward, buckets) of the last finished step
        self._reset()

    def _reset(self) -> None:
        self.ready: set[int] = set()
        self.pending: list[tuple[Bucket, Any, torch.Tensor]] = []
        self.in_backward = 0

    def arm(self, last: bool) -> None:
        """Before a backward: whether it is the step's last (the one whose gradients are final)."""
        self.armed = last

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """megatron-core's `no_sync_func`: the pipeline schedule's backwards before the last one."""
        self.armed = False
        try:
            yield
        finally:
            self.armed = True

    def _done(self, index: int, _weight: torch.Tensor) -> None:
        if not self.armed:
            return
        self.ready.add(index)
        while len(self.pending) < len(self.buckets) and set(self.buckets[len(self.pending)].indices) <= self.ready:
            self._launch(self.buckets[len(self.pending)])
            self.in_backward += 1

    def _launch(self, bucket: Bucket) -> None:
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in bucket.targets]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.pending.append((bucket, dist.all_reduce(flat, group=self.group, async_op=True), flat))

    @torch.no_grad()
    def finish(self) -> set[int]:
        """Every bucket reduced (the rest launched now), the means written back; returns the ids
        (`id()`) of the tensors whose gradients it reduced."""
        for bucket in self.buckets[len(self.pending):]:
            self._launch(bucket)
        reduced: set[int] = set()
        for bucket, work, flat in self.pending:
            work.wait()
            flat.div_(self.divisor)
            offset = 0
            for t in bucket.targets:
                mean = flat[offset:offset + t.numel()].view_as(t)
                offset += t.numel()
                if t.grad is None:
                    t.grad = mean.clone()
                else:
                    t.grad.copy_(mean)
                reduced.add(id(t))
        self.last_step = (self.in_backward, len(self.buckets))
        self._reset()
        return reduced
