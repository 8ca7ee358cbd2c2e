"""Rollout routing replay (R3) on the rollout side: each request asks the engine for the experts it
routed every token to, and the sample keeps them (`sample.rollout_routed_experts`).

`request_fields(sample, shape)` adds SGLang's `return_routed_experts` and
`routed_experts_start_len` to a `/generate` payload: the engine reports positions from where the
sample's record ends (0 for a fresh sample), so a resumed partial sample and the next turn of a
multi-turn episode (whose input is the whole trajectory so far) get only what is new: the last
token of the previous request (never forwarded then), the observation tokens, the new response.
`keep_routing(sample, meta, start, shape)` appends the reply's positions to the record
(`relax.utils.routing.extend`). Custom generate functions call both around their own requests.
"""

from __future__ import annotations

from typing import Any

from relax.types import Sample
from relax.utils.routing import RoutingShape, decode_reply, extend, positions

MISSING = ("the engine's reply has no meta_info.routed_experts: --use-rollout-routing-replay needs engines started "
           "with --enable-return-routed-experts (SGLang >= 0.5.8, or the hf engine; Relax sets it on the engines it "
           "launches, external ones must be started with it)")


def request_fields(sample: Sample, shape: RoutingShape | None, input_len: int | None = None) -> dict[str, Any]:
    """The payload fields asking for the routed experts of a request that continues `sample` (its
    record so far; `input_len`: the request's input tokens, which the start may not pass); {} when
    the run does not replay rollout routing (`shape` None)."""
    if shape is None:
        return {}
    start = positions(sample.rollout_routed_experts)
    if input_len is not None:
        start = min(start, input_len)
    return {"return_routed_experts": True, "routed_experts_start_len": start}


def keep_routing(sample: Sample, meta: dict[str, Any], start: int, shape: RoutingShape | None) -> None:
    """Append a reply's routed experts (positions from `start`, the request's
    `routed_experts_start_len`) to the sample's record. RuntimeError when the reply has none."""
    if shape is None:
        return
    if "routed_experts" not in meta:
        raise RuntimeError(f"sample {sample.index}: {MISSING}")
    reply = decode_reply(meta["routed_experts"], shape)
    sample.rollout_routed_experts = extend(sample.rollout_routed_experts, reply, start)


def batch_fields(shape: RoutingShape | None) -> dict[str, Any]:
    """The fields of a batched request for fresh samples (every record starts at position 0)."""
    return {} if shape is None else {"return_routed_experts": True, "routed_experts_start_len": 0}
