"""`--timeline-dump-dir`: a Chrome-trace timeline of every role's phases (open it in Perfetto).

Each process records spans (`Timeline.span(name, step=k)`) as complete events ("ph": "X") with
wall-clock microseconds, one JSON line each, appended to `<dir>/<process>.<pid>.jsonl` as it
closes (a crash loses nothing recorded before it). Roles get their spans without code of their
own: the Serve replica wrapper (`relax.core.service.replica_class`) times every public method
call of the component (`rollout.generate`, `actor.train`, `reference.forward`,
`actor.update_weights`, ...; calls a role makes on itself too, so a fully async role's loop
shows its steps), and the Controller times each phase of its loop. At the end of the run
`merge_traces` writes `<dir>/timeline.json` ({"traceEvents": [...]}): one track per process
(role), one row per thread, the step in each event's args.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import threading
import time
from typing import Any, Callable, Iterator

TIMELINE_DIR_ENV = "RELAX_TIMELINE_DIR"


class Timeline:
    """Spans of one process, appended to `<directory>/<process>.<pid>.jsonl` (no-op without a directory)."""

    def __init__(self, directory: str | None, process: str):
        self.directory, self.process = directory, process
        self._lock = threading.Lock()
        self._path = None
        if directory:
            os.makedirs(directory, exist_ok=True)
            self._path = os.path.join(directory, f"{process}.{os.getpid()}.jsonl")

    @property
    def enabled(self) -> bool:
        return self._path is not None

    def record(self, name: str, start_s: float, end_s: float, **args: Any) -> None:
        if self._path is None:
            return
        event = {"name": name, "ph": "X", "ts": round(start_s * 1e6), "dur": max(1, round((end_s - start_s) * 1e6)),
                 "pid": self.process, "tid": threading.current_thread().name,
                 "args": {k: v for k, v in args.items() if v is not None}}
        line = json.dumps(event) + "\n"
        with self._lock, open(self._path, "a") as f:
            f.write(line)

    @contextlib.contextmanager
    def span(self, name: str, **args: Any) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.record(name, start, time.time(), **args)


def _step_of(args: tuple, kwargs: dict) -> int | None:
    """The step a role method works on: its first int argument (or `step` / `rollout_id`)."""
    for key in ("step", "rollout_id"):
        if isinstance(kwargs.get(key), int):
            return kwargs[key]
    return next((a for a in args if isinstance(a, int) and not isinstance(a, bool)), None)


def timed_methods(cls: type, timeline_of: Callable[[Any], Timeline]) -> dict[str, Callable]:
    """Wrappers of `cls`'s public methods that record a span per call on `timeline_of(self)` (for
    a subclass's dict)."""
    wrapped: dict[str, Callable] = {}
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_"):
            continue
        if inspect.iscoroutinefunction(fn):
            async def call(self: Any, *args: Any, _fn: Callable = fn, _name: str = name, **kwargs: Any) -> Any:
                with timeline_of(self).span(_name, step=_step_of(args, kwargs)):
                    return await _fn(self, *args, **kwargs)
        else:
            def call(self: Any, *args: Any, _fn: Callable = fn, _name: str = name, **kwargs: Any) -> Any:
                with timeline_of(self).span(_name, step=_step_of(args, kwargs)):
                    return _fn(self, *args, **kwargs)
        wrapped[name] = functools.wraps(fn)(call)
    return wrapped


def merge_traces(directory: str) -> str:
    """Write `<directory>/timeline.json` from every process's span file; returns its path."""
    events: list[dict] = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                events += [json.loads(line) for line in f if line.strip()]
    processes = sorted({e["pid"] for e in events}, key=lambda p: (p != "controller", p))
    pids = {p: i for i, p in enumerate(processes)}
    threads: dict[tuple[str, str], int] = {}
    trace: list[dict] = [{"name": "process_name", "ph": "M", "pid": pids[p], "args": {"name": p}} for p in processes]
    for event in sorted(events, key=lambda e: e["ts"]):
        key = (event["pid"], event["tid"])
        if key not in threads:
            threads[key] = len(threads)
            trace.append({"name": "thread_name", "ph": "M", "pid": pids[key[0]], "tid": threads[key],
                          "args": {"name": key[1]}})
        trace.append({**event, "pid": pids[event["pid"]], "tid": threads[key]})
    path = os.path.join(directory, "timeline.json")
    with open(path, "w") as f:
        json.dump({"traceEvents": trace, "displayTimeUnit": "ms"}, f)
    return path
