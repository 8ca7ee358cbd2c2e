"""--timeline-dump-dir: spans per process, role methods timed without code of their own, and one
Chrome-trace file merged from every process's spans."""

from __future__ import annotations

import asyncio
import json
import time

from relax.utils.timeline import Timeline, merge_traces, timed_methods


class _Role:
    def __init__(self, timeline):
        self.timeline = timeline

    async def generate(self, step: int) -> int:
        await asyncio.sleep(0.01)
        return step

    def train(self, rollout_id: int = 0) -> str:
        return self.helper()

    def helper(self) -> str:
        return "ok"

    def _private(self) -> None:
        pass


def test_role_methods_record_spans_and_the_merged_trace_has_one_track_per_process(tmp_path):
    controller = Timeline(str(tmp_path), "controller")
    timed = type("Timed", (_Role,), timed_methods(_Role, lambda self: self.timeline))
    role = timed(Timeline(str(tmp_path), "rollout"))
    with controller.span("rollout", step=3):
        assert asyncio.run(role.generate(3)) == 3
    with controller.span("train", step=3):
        assert role.train(rollout_id=3) == "ok"
    assert not hasattr(timed.__dict__.get("_private"), "__wrapped__")

    trace = json.loads((tmp_path / merge_traces(str(tmp_path))).read_text())["traceEvents"]
    meta = {e["args"]["name"]: e["pid"] for e in trace if e["name"] == "process_name"}
    assert meta == {"controller": 0, "rollout": 1}
    spans = [e for e in trace if e["ph"] == "X"]
    assert [(e["pid"], e["name"], e["args"].get("step")) for e in spans] == [
        (0, "rollout", 3), (1, "generate", 3), (0, "train", 3), (1, "train", 3), (1, "helper", None)]
    generate = next(e for e in spans if e["name"] == "generate")
    outer = next(e for e in spans if e["name"] == "rollout")
    assert generate["dur"] >= 10_000 and outer["ts"] <= generate["ts"]
    assert outer["ts"] + outer["dur"] >= generate["ts"] + generate["dur"]
    assert all(isinstance(e["tid"], int) for e in spans)


def test_without_a_directory_nothing_is_written(tmp_path):
    timeline = Timeline(None, "controller")
    with timeline.span("x"):
        time.sleep(0)
    assert not timeline.enabled and list(tmp_path.iterdir()) == []


def test_the_renderer_draws_every_row_and_span(tmp_path):
    """scripts/tools/render_timeline.py: an SVG with a labelled row per process and a bar per span."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ET
    from pathlib import Path

    controller, rollout = Timeline(str(tmp_path), "controller"), Timeline(str(tmp_path), "rollout")
    for step in range(3):
        with controller.span("rollout", step=step), rollout.span("generate", step=step):
            time.sleep(0.002)
    trace = merge_traces(str(tmp_path))
    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "t.svg"
    proc = subprocess.run([sys.executable, "scripts/tools/render_timeline.py", trace, str(out), "--from-step", "1"],
                          cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    svg = ET.parse(out).getroot()
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "controller" in texts and "rollout" in texts
    bars = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.find("{http://www.w3.org/2000/svg}title")
            is not None]
    assert len(bars) == 4  # steps 1 and 2, a controller and a role span each
