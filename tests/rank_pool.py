"""Two spawned rank processes kept for the test session, for the unit tests that need two
torch.distributed ranks (gloo) of the training backends.

Why: such a test used to spawn its own two processes, and each spent ~5 s of CPU importing torch,
transformers and megatron-core before its first collective; a suite run spawned 16 of them on a
2-core machine. The pool's processes import once and run one job after another. A job is
`fn(*args)` on each rank at once, `fn` a module-level function (pickled by name, as
`multiprocessing` spawn targets are; the caller's sys.path goes with it); it builds and tears down
its own process group, as a rank process did. After every job a rank destroys what a job may leave
behind (the default process group, megatron's parallel state). A job that fails or runs out of
time stops both processes (a rank left waiting for a failed peer would block the next job); the
next job starts new ones.

`pool.submit(fn, [args_rank0, args_rank1])` returns at once (the caller may run its single-rank
reference in-process meanwhile); `pool.wait(job, timeout)` raises with every rank's traceback.
A job whose caller failed before `wait` is stopped by the next `submit` (new processes).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence


def _reset() -> None:
    """What a job may leave behind in a rank process, destroyed before the next job."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    parallel_state = sys.modules.get("megatron.core.parallel_state")
    if parallel_state is not None:
        parallel_state.destroy_model_parallel()


def _serve(conn: Connection) -> None:
    """A rank process: run each job sent, answer None or the traceback, until None arrives."""
    while True:
        job = conn.recv()
        if job is None:
            return
        path, payload = job
        sys.path.extend(p for p in path if p not in sys.path)  # a test directory imported since the start
        try:
            fn, args = pickle.loads(payload)
            fn(*args)
            answer = None
        except BaseException:  # noqa: BLE001 - every failure goes back to the test, named
            answer = traceback.format_exc()
        try:
            _reset()
        except Exception:  # noqa: BLE001 - a rank that cannot be reset is not reused
            answer = (answer or "") + "\nreset after the job failed:\n" + traceback.format_exc()
        conn.send(answer)
        if answer is not None:
            return


@dataclass
class Job:
    what: str
    conns: list[Connection]


class RankPool:
    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._busy = False

    def _start(self) -> None:
        for _ in range(self.size):
            mine, theirs = self._ctx.Pipe()
            proc = self._ctx.Process(target=_serve, args=(theirs,), daemon=True)
            proc.start()
            theirs.close()
            self._procs.append(proc)
            self._conns.append(mine)

    def submit(self, fn: Callable[..., Any], args: Sequence[tuple], what: str = "") -> Job:
        """Run `fn(*args[r])` on rank process r, for every rank at once."""
        assert len(args) == self.size, f"{len(args)} ranks' arguments for a pool of {self.size}"
        if self._busy or not self._procs or not all(p.is_alive() for p in self._procs):
            # (busy: the last job's caller failed before wait(), and its ranks may still run it)
            self.close(kill=True)
            self._busy = False
            self._start()
        for conn, rank_args in zip(self._conns, args):
            conn.send((list(sys.path), pickle.dumps((fn, tuple(rank_args)))))
        self._busy = True
        return Job(what or getattr(fn, "__name__", "job"), list(self._conns))

    def wait(self, job: Job, timeout: float) -> None:
        """Wait for every rank; on a failure, a dead rank or the deadline stop the pool and raise."""
        deadline, pending, errors = time.monotonic() + timeout, list(job.conns), []
        try:
            while pending and not errors:
                ready = wait(pending + [p.sentinel for p in self._procs], max(deadline - time.monotonic(), 0))
                if not ready:
                    errors.append(f"no answer within {timeout:.0f}s")
                    break
                for conn in [c for c in pending if c in ready]:
                    pending.remove(conn)
                    rank = job.conns.index(conn)
                    try:
                        answer = conn.recv()
                    except (EOFError, OSError):  # the process is gone
                        self._procs[rank].join(5)
                        answer = f"the rank process exited with code {self._procs[rank].exitcode}"
                    if answer is not None:
                        errors.append(f"rank {rank}:\n{answer}")
                dead = [i for i, p in enumerate(self._procs) if not p.is_alive() and job.conns[i] in pending]
                errors += [f"rank {i} exited with code {self._procs[i].exitcode}" for i in dead]
        finally:
            self._busy = False
            if errors or pending:
                self.close(kill=True)
        assert not errors, f"{job.what}: " + "\n".join(errors)

    def run(self, fn: Callable[..., Any], args: Sequence[tuple], timeout: float, what: str = "") -> None:
        self.wait(self.submit(fn, args, what), timeout)

    def close(self, kill: bool = False) -> None:
        """Stop the rank processes: asked to, or killed (`kill`: after a failure, a rank may be
        waiting in a collective for its failed peer)."""
        kill = kill or self._busy
        for conn, proc in zip(self._conns, self._procs):
            if not kill:
                try:
                    conn.send(None)
                except OSError:
                    pass
                proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            conn.close()
        self._procs, self._conns = [], []
