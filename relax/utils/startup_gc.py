"""Python's full garbage collections held back while a process Relax starts is starting, and skipped at its exit.

A role replica, a training rank or an hf engine imports torch, transformers and TransferQueue
before its first call: some 750,000 objects. CPython 3.11 runs a full collection each time the
objects that survived the young collections grew by a quarter, so a start-up runs about seven of
them, each over everything imported so far; measured on the 2-core CI machine they took 1.1 of the
8.5 CPU-seconds of `import torch, transformers, transfer_queue` and a model class, and the suite
starts some 850 processes.

`defer()` (run by `relax/__init__.py`, so before any of those imports) raises the oldest
generation's threshold when `RELAX_STARTUP_GC=1`, which configs/env.yaml hands to every role
process (Serve replicas, training ranks, engines): no full collection runs while the process
starts, and the young generations are collected as usual (short-lived cycles are freed as
before). `started()` puts CPython's thresholds back; a role replica calls it when its constructor
returns (`relax.core.service.replica_class`), a training rank when its model is built
(`Trainer.__init__`), the hf engine when its model is loaded, a reward worker after its preloads
(`relax.engine.rewards.worker.preload`). A process that never calls it keeps collecting its oldest
generation, only after 1,000 middle-generation collections instead of 10.
Thresholds someone else set (the variable unset, or `gc.set_threshold` called) are left alone.

The same processes skip the full collection at their exit: interpreter finalization runs one over
everything still alive, which frees nothing the OS would not (measured: a process with torch,
transformers, Ray and megatron-core imported exits in 1.8-1.9 s with it, 0.2 s without). `defer()`
registers `gc.freeze` as an exit handler, which moves every object out of the collector's reach
once the process's other exit handlers have run. The processes Ray kills (replicas, ranks) never
get there; those that end by returning do: drivers, spawned ranks, data preparation. Finalizers of
objects left in reference cycles then do not run at exit, which CPython never promised.
"""

from __future__ import annotations

import atexit
import gc
import os

ENV = "RELAX_STARTUP_GC"
DEFERRED_OLDEST = 1000  # middle-generation collections between two full ones while deferred (CPython: 10)

_saved: tuple[int, int, int] | None = None  # the thresholds before defer(), while deferred
_exit_skipped = False  # gc.freeze registered to run at exit


def defer() -> bool:
    """Hold back full collections until `started()` and skip the one at exit, where the variable asks
    for it; True if it held them back."""
    global _saved, _exit_skipped
    if os.environ.get(ENV) != "1":
        return False
    if not _exit_skipped:  # (registered at `import relax`: runs after the exit handlers of later imports)
        atexit.register(gc.freeze)
        _exit_skipped = True
    if _saved is not None:
        return False
    young, middle, oldest = gc.get_threshold()
    if oldest >= DEFERRED_OLDEST:
        return False
    _saved = (young, middle, oldest)
    gc.set_threshold(young, middle, DEFERRED_OLDEST)
    return True


def started() -> None:
    """This process has started: the thresholds `defer()` changed go back (unless changed since)."""
    global _saved
    if _saved is None:
        return
    if gc.get_threshold() == (_saved[0], _saved[1], DEFERRED_OLDEST):
        gc.set_threshold(*_saved)
    _saved = None


def deferred() -> bool:
    return _saved is not None
