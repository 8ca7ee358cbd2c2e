"""Phase marks of a weight push on the receiving side, for bench/weight_sync.py's timeline.

With `RELAX_WEIGHT_SYNC_TRACE=<file>` in an engine's environment, `mark(name)` appends one line
`{"name": ..., "t": <time.perf_counter()>}` to that file; unset (every real run), `mark` is a test
of one global. The sender's spans and these marks share the host's monotonic clock, so the bench
lays the engine's phases (arm handled, loop started, model walked, each bucket in, end answered)
on the same axis as the sender's: where a push's fixed cost goes, seen from both sides.
"""

from __future__ import annotations

import json
import os
import threading
import time

TRACE_ENV = "RELAX_WEIGHT_SYNC_TRACE"

_path = os.environ.get(TRACE_ENV) or None
_lock = threading.Lock()


def mark(name: str) -> None:
    """Record that the push reached `name` now (a no-op unless tracing)."""
    if _path is None:
        return
    line = json.dumps({"name": name, "t": time.perf_counter()}) + "\n"
    with _lock, open(_path, "a") as f:
        f.write(line)


def read(path: str, since: float) -> list[tuple[str, float]]:
    """The marks in `path` at or after `since` (perf_counter seconds), in order."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        marks = [json.loads(line) for line in f if line.strip()]
    return [(m["name"], m["t"]) for m in marks if m["t"] >= since]
