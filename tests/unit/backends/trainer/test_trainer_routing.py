"""The trainer's routing bookkeeping (relax.backends.trainer.routing.RouteBook): a row replays its
R3 record, else what the policy's first forward recorded for it (R2), else routes freely; only the
policy's ranks record, only rows without a record are kept, and `forget` ends the step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from relax.backends.base import Rows, Scores, TrainerSpec
from relax.backends.trainer.routing import RouteBook
from relax.utils.routing import RoutingShape, to_bytes

SHAPE = RoutingShape(layers=2, top_k=2, num_experts=8)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_hidden_layers": 2,
                                                      "num_experts": 8, "num_experts_per_tok": 2}))
    return str(tmp_path)


def record(n: int, value: int) -> np.ndarray:
    return np.full((n, 2, 2), value, dtype=np.uint8)


def test_r3_rows_replay_their_record_and_the_rest_record_then_replay(model_dir):
    book = RouteBook(TrainerSpec(model_path=model_dir, routing_replay=True))
    rows = book.attach(Rows([[1, 2, 3], [4, 5, 6, 7]], [1, 2]), [to_bytes(record(2, 3), SHAPE), b""])
    assert (rows.routing[0] == 3).all() and rows.routing[1] is None and rows.record_routing
    book.keep(rows, Scores(None, None, routing=[record(2, 5), record(3, 6)]))
    assert list(book.kept) == [(4, 5, 6, 7)]  # the R3 row keeps nothing: its record is the engine's
    again = book.attach(Rows([[4, 5, 6, 7]], [2]), None)
    assert (again.routing[0] == 6).all() and not again.record_routing
    assert book.forget() == 1 and book.attach(Rows([[4, 5, 6, 7]], [2]), None).routing is None


def test_frozen_scorers_replay_but_never_record(model_dir):
    book = RouteBook(TrainerSpec(model_path=model_dir, routing_replay=True, trainable=False))
    rows = book.attach(Rows([[1, 2, 3]], [1]), None)
    assert rows.routing is None and not rows.record_routing


@pytest.mark.parametrize("spec", [dict(routing_replay=False), dict(routing_replay=True, head="value")])
def test_off_or_a_value_head_leaves_rows_alone(model_dir, spec):
    rows = Rows([[1, 2, 3]], [1])
    assert RouteBook(TrainerSpec(model_path=model_dir, **spec)).attach(rows, [to_bytes(record(2, 3), SHAPE)]) is rows
