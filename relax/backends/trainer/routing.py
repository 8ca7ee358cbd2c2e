"""Which MoE routing each forward of a row replays (routing replay, docs/moe.md): the trainer's
bookkeeping, the same for every backend (the runners apply it: `Rows.routing`).

R3 (--use-rollout-routing-replay): a row arrives with the engine's record (the data plane's
`rollout_routed_experts` bytes, `relax.utils.routing`) and every forward of it replays that: old
log-probs, training passes, the Reference. R2 (--use-routing-replay alone): the policy's first
forward over a row (the old log-probs, else the first training pass) records the routing it used
(`Rows.record_routing`, returned in `Scores.routing`) and the later passes over the same row replay
it. Rows are known by their tokens; the Actor drops the records when its step ends
(`forget`). A row with neither replays nothing: its tokens are routed by the model's own router,
as are positions past a record's end.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from relax.backends.base import Rows, Scores, TrainerSpec
from relax.utils.routing import RoutingShape, from_bytes


def routing_shape(model_path: str) -> RoutingShape | None:
    with open(os.path.join(model_path, "config.json")) as f:
        return RoutingShape.from_config(json.load(f))


class RouteBook:
    """One rank's routing replay state (module doc)."""

    def __init__(self, spec: TrainerSpec) -> None:
        self.shape = routing_shape(spec.model_path) if spec.routing_replay and spec.head == "lm" else None
        self.records = spec.trainable  # R2 records in the policy's own ranks only
        self.kept: dict[tuple[int, ...], np.ndarray] = {}

    def attach(self, rows: Rows, rollout: list[Any] | None) -> Rows:
        """`rows` with what each replays (`rollout`: their R3 records as bytes, or None) and whether
        the forward records (some row has nothing to replay, in the policy's ranks)."""
        if self.shape is None or not rows.tokens:
            return rows
        routes = [self._route(tokens, None if rollout is None else rollout[i]) for i, tokens in enumerate(rows.tokens)]
        return dataclasses.replace(rows, routing=routes if any(r is not None for r in routes) else None,
                                   record_routing=self.records and any(r is None for r in routes))

    def _route(self, tokens: list[int], rollout: Any) -> np.ndarray | None:
        if rollout is not None and len(rollout):
            return from_bytes(rollout, self.shape)
        return self.kept.get(tuple(tokens))

    def keep(self, rows: Rows, scores: Scores) -> None:
        """R2: the routing a recording forward used, for rows that had none to replay."""
        if not rows.record_routing or scores.routing is None:
            return
        for i, (tokens, recorded) in enumerate(zip(rows.tokens, scores.routing)):
            if rows.routing is None or rows.routing[i] is None:
                self.kept[tuple(tokens)] = recorded

    def forget(self) -> int:
        """Drop every R2 record (the step is trained); how many there were."""
        count, self.kept = len(self.kept), {}
        return count
