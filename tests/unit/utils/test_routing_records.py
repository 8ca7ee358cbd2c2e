"""Routing records (relax.utils.routing): SGLang's `meta_info.routed_experts` decoded, records extended
by later requests, and the compact bytes a row carries on the data plane."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from relax.utils.routing import RoutingShape, decode_reply, encode_reply, extend, from_bytes, positions, to_bytes

SHAPE = RoutingShape(layers=3, top_k=2, num_experts=8)


def sglang_reply(ids: np.ndarray) -> str:
    """What SGLang's detokenizer sends: base64 of the int32 tensor's bytes (`_extract_routed_experts`)."""
    return base64.b64encode(np.ascontiguousarray(ids, dtype=np.int32).tobytes()).decode("utf-8")


def test_shape_from_moe_configs_and_none_for_dense():
    assert RoutingShape.from_config({"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8}) == \
        RoutingShape(48, 8, 128)
    vl = {"model_type": "qwen3_vl_moe", "text_config": {"num_hidden_layers": 4, "num_experts": 300,
                                                        "num_experts_per_tok": 4}}
    assert RoutingShape.from_config(vl) == RoutingShape(4, 4, 300)
    mixtral = {"num_hidden_layers": 2, "num_local_experts": 8, "num_experts_per_tok": 2}
    assert RoutingShape.from_config(mixtral).top_k == 2
    assert RoutingShape.from_config({"num_hidden_layers": 28, "intermediate_size": 3072}) is None


def test_ids_take_one_byte_up_to_256_experts_and_two_past():
    assert RoutingShape(2, 2, 256).dtype == np.uint8
    assert RoutingShape(2, 2, 384).dtype == np.dtype("<i2")


def test_sglang_reply_decodes_to_positions_layers_topk():
    ids = np.arange(5 * 3 * 2).reshape(5, 3, 2) % 8
    out = decode_reply(sglang_reply(ids), SHAPE)
    assert out.shape == (5, 3, 2) and out.dtype == np.uint8 and (out == ids).all()
    assert decode_reply(encode_reply(ids), SHAPE).tolist() == ids.tolist()  # the hf engine's encoding is SGLang's
    assert decode_reply("", SHAPE).shape == (0, 3, 2)  # an aborted request before its prefill


@pytest.mark.parametrize("ids,message", [(np.zeros(7), "not a whole number of tokens"),
                                         (np.full((2, 3, 2), 8), r"outside \[0, 8\)")])
def test_a_reply_of_another_model_is_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        decode_reply(sglang_reply(ids), SHAPE)


def test_extend_keeps_what_was_recorded_before_the_request_start():
    first = np.ones((6, 3, 2), dtype=np.uint8)
    more = np.full((4, 3, 2), 2, dtype=np.uint8)
    merged = extend(first, more, start=5)  # the request re-prefilled position 5 (the last sampled token)
    assert positions(merged) == 9 and (merged[:5] == 1).all() and (merged[5:] == 2).all()
    assert (extend(None, more, 0) == more).all()
    with pytest.raises(ValueError, match="routed_experts_start_len"):
        extend(first, more, start=7)  # a gap nobody recorded


def test_bytes_round_trip_in_both_dtypes():
    for shape in (SHAPE, RoutingShape(3, 2, 1000)):
        ids = (np.arange(4 * 3 * 2).reshape(4, 3, 2) * 37 % shape.num_experts).astype(shape.dtype)
        data = to_bytes(ids, shape)
        assert len(data) == ids.size * shape.dtype.itemsize
        assert (from_bytes(data, shape) == ids).all()
    assert to_bytes(None, SHAPE) == b"" and from_bytes(b"", SHAPE).shape == (0, 3, 2)
    with pytest.raises(ValueError, match="different models"):
        from_bytes(b"\x00" * 5, SHAPE)
