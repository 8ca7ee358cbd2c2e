"""The scaling API's bodies, validated at the boundary: addresses normalised, everything else refused
with a 400 naming the field."""

from __future__ import annotations

import pytest

from relax.engine.elastic.operations import ScalingError
from relax.engine.elastic.requests import address, idempotency_key, scale_in_request, scale_out_request


def test_addresses_are_normalised_to_engine_urls():
    assert address("10.0.0.7:30000") == "http://10.0.0.7:30000"
    assert address("http://node-3.cluster:8000/") == "http://node-3.cluster:8000"
    assert address("[::1]:30000") == "http://[::1]:30000"
    assert scale_out_request({"addresses": ["h:1", "h:2"]}) == {"addresses": ["http://h:1", "http://h:2"]}
    assert scale_in_request({"engines": ["engine-2", "h:1"]}) == {"engines": ["engine-2", "http://h:1"]}


@pytest.mark.parametrize("body, words", [
    ({"addresses": ["h:1", "http://h:1"]}, "given twice"),
    ({"addresses": []}, "non-empty list"),
    ({"addresses": ["h:99999"]}, "between 1 and 65535"),
    ({"addresses": ["user@h:1"]}, "no path"),
    ({"target_engines": 0}, "between 1 and 1024"),
    ({}, "exactly one of"),
])
def test_bad_scale_out_bodies(body, words):
    with pytest.raises(ScalingError, match=words) as err:
        scale_out_request(body)
    assert err.value.status == 400


def test_the_idempotency_key_comes_from_the_body_or_the_header_and_they_must_agree():
    assert idempotency_key({"idempotency_key": "a-1"}, None) == "a-1"
    assert idempotency_key({}, "b.2") == "b.2" and idempotency_key({}, None) is None
    with pytest.raises(ScalingError, match="differ"):
        idempotency_key({"idempotency_key": "a"}, "b")
    with pytest.raises(ScalingError, match="engines: must be a list"):
        scale_in_request({"engines": "engine-1"})
