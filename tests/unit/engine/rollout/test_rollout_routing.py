"""The rollout's side of R3 (relax.engine.rollout.routing): each request asks from where the sample's
record ends and the reply extends it; a reply without routed experts names the engine flag.
Against a real engine: tests/unit/engine/agentic/test_agentic_routing.py."""

from __future__ import annotations

import numpy as np
import pytest

from relax.engine.rollout.routing import batch_fields, keep_routing, request_fields
from relax.types import Sample
from relax.utils.routing import RoutingShape, encode_reply

SHAPE = RoutingShape(layers=2, top_k=2, num_experts=8)


def test_no_fields_without_r3_and_a_fresh_sample_asks_from_position_0():
    assert request_fields(Sample(), None) == {} and batch_fields(None) == {}
    assert request_fields(Sample(tokens=[1, 2, 3]), SHAPE) == {"return_routed_experts": True,
                                                               "routed_experts_start_len": 0}
    assert batch_fields(SHAPE)["routed_experts_start_len"] == 0


def test_a_continuation_asks_from_the_records_end_and_appends_the_reply():
    sample = Sample(index=3, tokens=[1, 2, 3, 4, 5], rollout_routed_experts=np.ones((4, 2, 2), dtype=np.uint8))
    fields = request_fields(sample, SHAPE, input_len=7)
    assert fields["routed_experts_start_len"] == 4
    keep_routing(sample, {"routed_experts": encode_reply(np.full((5, 2, 2), 2))}, 4, SHAPE)
    assert sample.rollout_routed_experts.shape == (9, 2, 2) and (sample.rollout_routed_experts[4:] == 2).all()
    assert request_fields(sample, SHAPE, input_len=6)["routed_experts_start_len"] == 6  # never past the input


def test_a_reply_without_routed_experts_names_the_flag():
    with pytest.raises(RuntimeError, match="--enable-return-routed-experts"):
        keep_routing(Sample(index=1), {"output_token_logprobs": []}, 0, SHAPE)
    keep_routing(Sample(index=1), {}, 0, None)  # R3 off: nothing asked, nothing kept
