"""`--enable-cuda-memory-check`: the free GPU memory logged before each collective, and the GPU
memory state attached to the error when one fails.

A switch for the whole process, turned on once by a training rank at start (`enable`; the rank's
profiling, `relax.backends.trainer.profiling`). The collectives of the weight sync
(`relax.distributed.weights.group.WeightGroup`: every broadcast, sender and receiving ranks) and of
the gradient path (the Trainer's forward/backward with FSDP's all-gathers and reduce-scatters, the
gradient reduction and norm, the gather of a weight push, the micro-batch count agreement) run
inside `collective(name)`, which does nothing while the switch is off. On:
    before   one log line: the collective's name, the GPU's free and total memory, what this
             process's caching allocator has allocated and reserved;
    failure  the same figures taken again after the failure (or why they could not be) and those
             from before, added to the exception as a note (`BaseException.add_note`, shown in
             its traceback); the exception itself propagates unchanged.
The figures come from the `query` given to `enable` (`cuda_memory(device)` on a rank), so a test
can pass a fake one.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable, Iterator

logger = logging.getLogger(__name__)

GIB = float(1 << 30)


@dataclass(frozen=True)
class GpuMemory:
    """One reading: the GPU's free and total bytes, this process's allocated and reserved bytes."""

    free: int
    total: int
    allocated: int
    reserved: int

    def describe(self) -> str:
        return (f"{self.free / GIB:.2f} GiB free of {self.total / GIB:.2f} GiB; this process: "
                f"{self.allocated / GIB:.2f} GiB allocated, {self.reserved / GIB:.2f} GiB reserved")


def cuda_memory(device: object) -> Callable[[], GpuMemory]:
    """The reading of CUDA device `device` (torch.cuda.mem_get_info and the caching allocator's counters)."""
    import torch

    def read() -> GpuMemory:
        free, total = torch.cuda.mem_get_info(device)
        return GpuMemory(free, total, torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))

    return read


class MemoryCheck:
    """Readings around collectives (module doc); `query` reads the GPU memory."""

    def __init__(self, query: Callable[[], GpuMemory]) -> None:
        self.query = query

    @contextlib.contextmanager
    def around(self, name: str) -> Iterator[None]:
        before = self.query()
        logger.info("%s: %s (before the collective)", name, before.describe())
        try:
            yield
        except Exception as exc:  # annotated and re-raised: the failure itself is the caller's
            exc.add_note(f"--enable-cuda-memory-check: {name} failed; GPU memory before it: {before.describe()}; "
                         f"after: {self._after()}")
            raise

    def _after(self) -> str:
        """A reading after a failure; a CUDA context a failure left broken may not answer."""
        try:
            return self.query().describe()
        except RuntimeError as exc:
            return f"unavailable ({type(exc).__name__}: {exc})"


_check: MemoryCheck | None = None  # the process's switch: set by `enable`


def enable(query: Callable[[], GpuMemory]) -> None:
    """Turn the check on for this process, reading GPU memory with `query`."""
    global _check
    _check = MemoryCheck(query)


def disable() -> None:
    global _check
    _check = None


def enabled() -> bool:
    return _check is not None


def collective(name: str) -> contextlib.AbstractContextManager[None]:
    """Run a collective inside this: its memory check when the switch is on, else nothing."""
    return _check.around(name) if _check is not None else contextlib.nullcontext()
