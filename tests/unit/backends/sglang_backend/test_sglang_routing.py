"""R3 on the sglang backend: --use-rollout-routing-replay launches SGLang with
`--enable-return-routed-experts` where the installed version has it with `routed_experts_start_len`
(>= 0.5.8), and fails naming the version needed otherwise; SGLang's reply (base64 of the int32
tensor `[seqlen - 1 - start, layers, top_k]`, as its detokenizer encodes it) decodes to the
sample's record. SGLang itself cannot run here: its parser checks the flag where it imports."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from relax.backends.sglang.launcher import engine_command, launch_sglang_engine
from relax.backends.sglang.routing import check_options, parse_version, routed_experts_options
from relax.components.engine_launch import engine_options
from relax.config import parse_config
from relax.utils.routing import RoutingShape, decode_reply, extend


@pytest.mark.parametrize("version", ["0.5.8", "0.5.8.post1", "0.5.10rc0", "0.5.23", "0.6.0"])
def test_versions_that_return_routed_experts_get_the_server_flag(version):
    assert routed_experts_options(version) == {"enable_return_routed_experts": True}


@pytest.mark.parametrize("version", ["0.5.6.post2", "0.5.7", "0.4.10"])
def test_older_versions_fail_naming_the_version_needed(version):
    with pytest.raises(ValueError, match=rf"needs sglang >= 0\.5\.8.*sglang {version} is installed"):
        routed_experts_options(version)
    with pytest.raises(ValueError, match="not installed"):
        routed_experts_options(None)
    with pytest.raises(ValueError, match="0.5.8"):
        check_options({"enable_return_routed_experts": True}, version)
    check_options({"mem_fraction_static": 0.8}, version)  # nothing asked, nothing checked
    assert parse_version("0.5.8.post1") == (0, 5, 8)


def r3_command(*flags: str) -> list[str]:
    cfg = parse_config(["--hf-checkpoint", "/models/qwen3-moe", "--use-rollout-routing-replay", *flags],
                       validate=False).replace(rollout_backend="sglang")
    argv, _ = engine_command("/models/qwen3-moe", host="127.0.0.1", port=30000, device="cuda:0",
                             options=engine_options(cfg, None))
    return argv


def test_the_rollout_launches_sglang_with_the_flag(monkeypatch):
    assert "--enable-return-routed-experts" in r3_command()
    monkeypatch.setattr("relax.backends.sglang.launcher.sglang_available", lambda: True)
    monkeypatch.setattr("relax.backends.sglang.routing.installed_version", lambda: "0.5.7")
    with pytest.raises(ValueError, match="needs sglang >= 0.5.8"):  # before any process starts
        launch_sglang_engine("/models/qwen3-moe", options={"enable_return_routed_experts": True})


def test_sglangs_own_parser_takes_the_flag(sglang_parser):
    assert sglang_parser(r3_command()[3:]).enable_return_routed_experts is True


def test_a_reply_encoded_as_sglangs_detokenizer_does_extends_the_record():
    """`pybase64.b64encode(tensor.numpy().tobytes())` of the int32 routing of positions
    [start, seqlen - 1) (0.5.8's `_extract_routed_experts`, 0.5.23's `_b64_encode_per_request`)."""
    shape = RoutingShape(layers=48, top_k=8, num_experts=128)
    full = torch.randint(0, 128, (30, 48, 8), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    first = base64.b64encode(full[:20].numpy().tobytes()).decode("utf-8")  # a 21-token request's reply
    record = extend(None, decode_reply(first, shape), 0)
    later = base64.b64encode(full[19:].numpy().tobytes()).decode("utf-8")  # asked from routed_experts_start_len 19
    record = extend(record, decode_reply(later, shape), 19)
    assert record.dtype == np.uint8 and np.array_equal(record, full.numpy())
