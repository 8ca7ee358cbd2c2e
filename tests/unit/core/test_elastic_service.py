"""The run's side of elastic scaling (`relax.core.elastic`): a finished operation and the engines that
joined or left with it are drawn on the Controller's timeline. (The service itself runs in real runs:
tests/integration/test_elastic.py.)"""

from __future__ import annotations

import json

from relax.core.elastic import draw
from relax.engine.elastic.operations import Operation
from relax.utils.timeline import Timeline


def test_an_operation_and_its_engines_are_drawn_on_the_timeline(tmp_path):
    timeline = Timeline(str(tmp_path), "controller")
    op = Operation(id="op-1", kind="scale_out", request={"num_engines": 1}, status="succeeded", created=100.0,
                   finished=112.5, added=["http://127.0.0.1:1"])
    draw(timeline, op)
    events = [json.loads(line) for f in tmp_path.glob("controller.*.jsonl") for line in f.read_text().splitlines()]
    assert [(e["name"], e["dur"]) for e in events] == [("scale_out (succeeded)", 12_500_000),
                                                      ("engine joins: http://127.0.0.1:1", 1000)]
    assert all(e["args"]["op"] == "op-1" for e in events)
