"""Rank 0's weight push to every receiver the DCS coordinator lists, lane by lane.

A lane is a set of receivers that take weights at one cadence (`every` N versions): the
engines and ActorFwd's ranks take every push (lane 1), the Reference takes every
`--ref-update-interval`-th. Each lane has its own `WeightSender` (one broadcast group, or CUDA IPC
handles for receivers on this rank's GPU), rebuilt when the coordinator's topology changes; a LoRA
run whose engines load adapters from disk (SGLang) has an `AdapterFileSender` instead.
Pushes run on a thread of their own with its event loop; a background push (fully async) sends
a snapshot there while the rank trains the next step, and the next push, a topology change or
shutdown waits for it first (and raises its error). With --check-weight-update-equal each push to a
lane is checked on its engines after it (`relax.distributed.weights.check.WeightCheck`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any

import torch

from relax.distributed.weights.adapter_files import AdapterFileSender
from relax.distributed.weights.check import WeightCheck
from relax.distributed.weights.sender import WeightSender

logger = logging.getLogger(__name__)


def sync_metrics(stats: Any, prefix: str = "weight_sync") -> dict[str, float]:
    return {f"{prefix}/bytes": float(stats.bytes), f"{prefix}/seconds": float(stats.seconds),
            f"{prefix}/gbps": float(stats.gbps), f"{prefix}/buckets": float(stats.num_buckets),
            f"{prefix}/version": float(stats.version)}


class WeightPush:
    """The senders of rank 0 (one per lane) and the thread their pushes run on."""

    def __init__(self, *, device: torch.device, backend: str, bucket_bytes: int, timeout_s: float,
                 adapter_files: tuple[str, dict[str, Any]] | None = None, check: bool = False) -> None:
        """`adapter_files`: (directory, adapter_config.json) when the receivers are SGLang engines that
        load a LoRA adapter from disk (`AdapterFileSender`); None: tensors by broadcast (`WeightSender`).
        `check` (--check-weight-update-equal): every push is checked on the engines it went to."""
        self.device, self.backend, self.bucket_bytes, self.timeout_s = device, backend, bucket_bytes, timeout_s
        self.adapter_files = adapter_files
        self.senders: dict[int, WeightSender | AdapterFileSender] = {}
        self._pending: Any = None  # a background push in flight
        self._loop: asyncio.AbstractEventLoop | None = None
        self.check = WeightCheck(timeout_s) if check else None

    def _submit(self, coro: Any) -> Any:
        """Run `coro` on the weight-sync thread's loop; returns a concurrent future."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True, name="weight-sync").start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Any) -> Any:
        return self._submit(coro).result()

    def finish_pending(self) -> dict[str, float]:
        """Wait for a background push (raising its error); its metrics, or {} if none was running."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else {}

    def settle(self) -> None:
        """Wait for a background push in flight to end; its metrics (or error) stay for the next push
        (elastic scale-in: an engine leaving the topology is stopped only once no push includes it)."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending])

    def connect(self, lane: int, endpoints: list[Any], api_key: str | None, pause_mode: str,
                devices: list[Any] | None, mine: str | None) -> str:
        """(Re)build lane `lane`'s sender over `endpoints`, with the GPUs each holds its weights on
        (`devices`); receivers on this rank's GPU (`mine`) take CUDA IPC handles, the others join
        the broadcast group. Returns how weights travel."""
        self.finish_pending()
        if lane in self.senders:
            self._run(self.senders.pop(lane).close())
        if self.adapter_files is not None:
            directory, config = self.adapter_files
            files = AdapterFileSender(endpoints, adapter_dir=directory, config=config, api_key=api_key,
                                      timeout_s=self.timeout_s, pause_mode=pause_mode)
            self._run(files.connect())
            self.senders[lane] = files
            return files.backend
        ipc_ranks = [len(gpus) if mine is not None and mine in (gpus or ()) else 0
                     for gpus in (devices or [()] * len(endpoints))]
        sender = WeightSender(endpoints, api_key=api_key, backend=self.backend, bucket_bytes=self.bucket_bytes,
                              timeout_s=self.timeout_s, device=self.device, pause_mode=pause_mode,
                              ipc_ranks=ipc_ranks)
        self._run(sender.connect())
        self.senders[lane] = sender
        ipc = sum(1 for n in ipc_ranks if n)
        return sender.backend if not ipc else f"cuda-ipc x{ipc}" + (
            f" + {sender.backend}" if ipc < len(ipc_ranks) else "")

    def push(self, state: list[tuple[str, torch.Tensor, bool]], version: int, lanes: list[int],
             background: bool) -> dict[str, float]:
        """Send `state` to `lanes`. `background`: a snapshot goes out on the thread and the metrics
        returned are those of the push that finished meanwhile (the previous one)."""
        finished = self.finish_pending()
        if not background:
            return self._run(self._push_lanes([(n, t) for n, t, _ in state], version, lanes))
        # Training must not change what is sent: parameters' own memory is copied.
        snapshot = [(name, t if fresh else t.clone()) for name, t, fresh in state]
        self._pending = self._submit(self._push_lanes(snapshot, version, lanes))
        return finished

    async def _push_lanes(self, named: list[tuple[str, torch.Tensor]], version: int,
                          lanes: list[int]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for lane in lanes:
            sender = self.senders[lane]
            checked = self.check if isinstance(sender, WeightSender) else None  # (adapter files: config refuses)
            if checked is not None:
                await checked.before(sender.receivers, version)
            stats = await sender.push(named, version=version)
            metrics |= sync_metrics(stats, "weight_sync" if lane == min(lanes) else f"weight_sync/every_{lane}")
            if checked is not None:
                metrics |= await checked.after(sender.receivers, named, version)
        return metrics

    def close(self) -> None:
        try:
            self.finish_pending()
        except Exception as err:  # noqa: BLE001 - shutting down regardless
            logger.warning("the last background weight push failed: %s", err)
        for lane in list(self.senders):
            self._run(self.senders.pop(lane).close())
