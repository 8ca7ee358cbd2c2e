"""The receiving side's phase marks (weights/trace.py): off unless the env var names a file; then
one line a mark on the host's perf_counter clock, read back from a point in time on."""

from __future__ import annotations

import time

from relax.distributed.weights import trace


def test_marks_are_written_only_when_tracing_and_read_back_from_a_time_on(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setattr(trace, "_path", None)
    trace.mark("not traced")
    assert not path.exists()

    monkeypatch.setattr(trace, "_path", str(path))
    trace.mark("before")
    since = time.perf_counter()
    trace.mark("engine: arm received")
    trace.mark("engine: loop done")
    marks = trace.read(str(path), since)
    assert [name for name, _ in marks] == ["engine: arm received", "engine: loop done"]
    assert since <= marks[0][1] <= marks[1][1] <= time.perf_counter()
    assert trace.read(str(tmp_path / "absent.jsonl"), 0.0) == []
