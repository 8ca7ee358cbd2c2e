"""--keep-old-actor: a rank keeps host copies of its weights at the versions the engines were given,
and scores old log-probs with the copy of the rows' version (slime keeps the rollout model the
same way: its `old_actor` / `rollout_actor` backups).

Who keeps what (`relax.config.train_memory.kept_versions`): the Actor's ranks in colocate mode with
--update-weights-interval N > 1 keep the weights of the last push to the engines (`pushed`);
ActorFwd's ranks in fully-async mode keep the last --max-staleness + 1 versions they received
(`received`: each push lands there as it lands on the engines). A copy is the rank's own state
(`ModelRunner.offload_tensors`: its shards of the weights and buffers, megatron's float32 main
weights too), byte for byte per storage, as the colocate offload moves it (`offload.HostStash`),
into buffers allocated once and reused (pinned on a GPU).

`weights_of(version)` swaps the copy in for a forward and the live weights back after it: the live
storages go to a scratch buffer first, so a push that was landing in between (a receiver's buckets
arrive as separate calls) loses nothing. Host memory: (copies + 1) x the rank's state; no GPU memory.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterable, Iterator

import torch

from relax.backends.trainer.offload import HostStash

logger = logging.getLogger(__name__)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class KeptWeights:
    """Up to `capacity` versions of a rank's weights on the host (oldest dropped first)."""

    def __init__(self, capacity: int, device: torch.device, tensors: Callable[[], Iterable[torch.Tensor]]) -> None:
        """`tensors`: the rank's state as `ModelRunner.offload_tensors` gives it (called at each copy)."""
        if capacity < 1:
            raise ValueError(f"KeptWeights keeps at least one version, got capacity {capacity}")
        self.capacity, self.device, self.tensors = capacity, torch.device(device), tensors
        self.copies: dict[int, list[torch.Tensor]] = {}  # version -> host bytes per storage, oldest first
        self.live: int | None = None  # the version the live weights are (None: unknown, or a push landing)
        self._scratch: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        """Host bytes held: the copies and the scratch buffer."""
        return sum(b.numel() for bufs in [*self.copies.values(), self._scratch] for b in bufs)

    def _storages(self) -> list[torch.UntypedStorage]:
        return HostStash.storages(self.tensors(), self.device)

    def _buffers(self, storages: list[torch.UntypedStorage], reuse: list[torch.Tensor]) -> list[torch.Tensor]:
        """Host byte buffers sized like `storages`, reusing `reuse`'s where the sizes match."""
        pin = self.device.type == "cuda"
        return [reuse[i] if i < len(reuse) and reuse[i].numel() == s.nbytes() else
                torch.empty(s.nbytes(), dtype=torch.uint8, pin_memory=pin) for i, s in enumerate(storages)]

    @torch.no_grad()
    def _copy(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        cuda = self.device.type == "cuda"
        for dst, src in pairs:
            dst.copy_(src, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(self.device)

    def _keep(self, version: int) -> None:
        storages = self._storages()
        reuse = self.copies.pop(version, None)
        if reuse is None and len(self.copies) >= self.capacity:
            reuse = self.copies.pop(next(iter(self.copies)))  # the oldest version's buffers
        buffers = self._buffers(storages, reuse or [])
        self._copy((b, _bytes_of(s)) for b, s in zip(buffers, storages))
        self.copies[version] = buffers

    def pushed(self, version: int) -> None:
        """The rank's weights were just pushed to the engines as `version` (the Actor): keep them.
        Training changes them next, so the live version is not tracked."""
        self._keep(version)

    def receiving(self) -> None:
        """A push starts landing in the live weights (a receiving rank): they are no version until it ends."""
        self.live = None

    def received(self, version: int | None) -> None:
        """The receiver's last complete version after a bucket landed: keep it once, when it is new (it
        changes with a push's last bucket; after the others it is the previous one, already kept, and
        the live weights stay no version)."""
        if version is None or version in self.copies:
            return
        self._keep(version)
        self.live = version

    @contextlib.contextmanager
    def weights_of(self, version: int) -> Iterator[None]:
        """The rank's weights are those of `version` inside the block, the live ones again after it."""
        if version == self.live:
            yield
            return
        kept = self.copies.get(version)
        if kept is None:
            raise RuntimeError(f"--keep-old-actor: no copy of weight version {version} on this rank (it keeps "
                               f"{sorted(self.copies) or 'none yet'}, at most {self.capacity}); rows older than "
                               "the copies kept mean the engines lagged more than the run's staleness bound")
        storages = self._storages()
        if [s.nbytes() for s in storages] != [b.numel() for b in kept]:
            raise RuntimeError(f"--keep-old-actor: the rank's state changed layout since version {version} was kept "
                               f"({len(kept)} storages kept, {len(storages)} now): is it offloaded?")
        self._scratch = self._buffers(storages, self._scratch)
        self._copy((b, _bytes_of(s)) for b, s in zip(self._scratch, storages))
        self._copy((_bytes_of(s), b) for b, s in zip(kept, storages))
        try:
            yield
        finally:
            self._copy((_bytes_of(s), b) for b, s in zip(self._scratch, storages))


def kept_weights_of(kept: KeptWeights | None, version: int | None) -> contextlib.AbstractContextManager:
    """`kept.weights_of(version)`; the live weights for `version` None. A version without kept weights
    is an error naming the flag (a rank built without --keep-old-actor's copies)."""
    if version is None:
        return contextlib.nullcontext()
    if kept is None:
        raise RuntimeError(f"scoring on kept weight version {version}, but this rank keeps none (--keep-old-actor "
                           "is off for its role)")
    return kept.weights_of(version)
