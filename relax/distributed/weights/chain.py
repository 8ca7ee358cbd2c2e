"""Rank 0's broadcasts of a push, in bucket order: `BroadcastChain`.

Why a chain: a sender keeps several buckets in flight (their requests, their packing), but a group's
broadcasts must leave in the order the receivers take them. Each bucket's broadcast runs in a daemon
thread of its own (`group.run_in_daemon_thread`: a broadcast has no timeout of its own on NCCL, the
replies are the waiters) and starts once the previous bucket's is sent (CPU) or queued (GPU: packing
on a stream of the push's own, the next bucket packed while this one is on the wire).

A link may wait for a gate instead (`gate`): bucket 0 of an armed push is packed while the arm requests
travel and goes on the wire once they are answered (`open_gate`), or not at all when the sender says the
arm failed (`broken`).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

import torch

from relax.distributed.weights.group import run_in_daemon_thread
from relax.distributed.weights.protocol import pack_flat


class BroadcastChain:
    """The order of one sender's broadcasts. `broken()`: the sender's word that nothing may go out (a gated
    link then sends nothing)."""

    def __init__(self, broken: Callable[[], bool]) -> None:
        self._broken = broken
        self._last = threading.Event()  # the last link's broadcast sent (CPU) or queued (GPU)
        self._last.set()
        self._gate: threading.Event | None = None
        self._streams: tuple[Any, Any] | None = None  # a GPU push's pack and wait streams (`_queue_flat`)

    def reset(self) -> None:
        """A new group: no broadcast of an earlier one to wait for."""
        self._last, self._gate = threading.Event(), None
        self._last.set()

    def gate(self) -> None:
        """The next link waits for `open_gate` (it packs meanwhile) rather than for the link before it."""
        self._gate = self._last = threading.Event()

    def open_gate(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    def add(self, group: Any, tensors: list[torch.Tensor], *, pack: bool) -> asyncio.Future:
        """Broadcast `tensors` on `group` (as one flat buffer with `pack`, packed, cast and copied once, in
        the link's thread while the previous bucket is on the wire) after the previous link; the future is
        done once they are sent."""
        previous, done = self._last, threading.Event()
        self._last = done
        gated = previous is self._gate
        if pack and group.device.type == "cuda":
            return run_in_daemon_thread(self._queue_flat, group, tensors, previous, done, gated)

        def broadcast() -> None:
            try:
                buffers = [pack_flat(tensors, group.device)] if pack else tensors
                previous.wait()
                if gated and self._broken():  # the arm failed: nothing may go on the wire
                    return
                for tensor in buffers:
                    group.broadcast(tensor, src=0)
                group.synchronize()
            finally:
                done.set()

        return run_in_daemon_thread(broadcast)

    def _queue_flat(self, group: Any, tensors: list[torch.Tensor], previous: threading.Event,
                    queued: threading.Event, gated: bool) -> None:
        """A flat bucket on a GPU: once the previous bucket's broadcast is queued, pack this one on
        the push's own stream and queue its broadcast behind the pack, with no wait on the host in
        between, so bucket i + 1 is packed while bucket i is on the wire (packing in several threads
        at once fought over the GIL: 7-18 ms a bucket). Returns once this bucket's bytes are sent.
        `gated`: packed first, and its broadcast queued once `previous` (the gate) is set, unless the
        arm failed."""
        device = group.device
        try:
            if not gated:
                previous.wait()
            with torch.cuda.device(device):
                if self._streams is None:
                    self._streams = torch.cuda.Stream(device), torch.cuda.Stream(device)
                pack_stream, wait_stream = self._streams
                pack_stream.wait_stream(torch.cuda.default_stream(device))  # the tensors are made there
                with torch.cuda.stream(pack_stream):
                    flat = pack_flat(tensors, device)
                if gated:
                    previous.wait()  # (the GIL is released meanwhile)
                    if self._broken():  # the arm failed: nothing may go on the wire
                        return
                with torch.cuda.stream(pack_stream):
                    work = group.broadcast_queued(flat, src=0)
                sent = torch.cuda.Event()
                with torch.cuda.stream(wait_stream):
                    work.wait()  # (the wait stream waits for the broadcast, not the pack stream)
                    sent.record(wait_stream)
        finally:
            queued.set()
        sent.synchronize()  # (the GIL is released meanwhile) then `flat` may go
