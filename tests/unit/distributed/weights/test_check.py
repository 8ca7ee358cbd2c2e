"""--check-weight-update-equal (`relax.distributed.weights.check.WeightCheck`): after a push, an hf
engine's checksums by HF name equal what the trainer sent (cast to the engine's dtype), and a
corrupted engine tensor is a WeightMismatch naming the tensor and the engine; SGLang engines go
through SGLang's weights checker (snapshot, reset, compare at the first push; agreeing checksums
after each); training ranks are not engines and are skipped. The hf engine runs in this process
behind an ASGI transport (no server process, no weight group)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import torch

from relax.backends.hf.engine import HFEngine
from relax.backends.hf.server import create_app
from relax.backends.hf.tiny_model import build_tiny_qwen3
from relax.distributed.weights.check import WeightCheck, WeightMismatch, tensor_checksum
from relax.distributed.weights.endpoints import CHECKSUMS, HTTPEndpoint, RayEndpoint, receiver_features
from relax.distributed.weights.protocol import BucketRejected, WeightSyncError
from relax.distributed.weights.receiver import hf_targets

URL = "http://hf-engine"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("check-model"), seed=0)


def _engine(model_dir, dtype: str = "auto") -> tuple[HFEngine, HTTPEndpoint]:
    engine = HFEngine(str(model_dir), dtype=dtype)
    return engine, HTTPEndpoint(URL, transport=httpx.ASGITransport(app=create_app(engine)))


def _sent(model_dir) -> list[tuple[str, torch.Tensor]]:
    """What a trainer pushes: the checkpoint's parameters by HF name (float32)."""
    from transformers import AutoModelForCausalLM

    return [(n, p.detach()) for n, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()]


def test_an_hf_engine_holding_what_was_sent_passes_and_a_corrupted_tensor_is_named(model_dir):
    engine, endpoint = _engine(model_dir)
    sent, check = _sent(model_dir), WeightCheck(timeout_s=30)

    async def go() -> tuple[frozenset, dict[str, float]]:
        features = await receiver_features(endpoint)
        metrics = await check.after([endpoint], sent, version=1)
        with torch.no_grad():
            hf_targets(engine.model)["model.layers.1.mlp.down_proj.weight"][0, 0] += 1e-3
        with pytest.raises(WeightMismatch, match=r"v2: engine http://hf-engine .* 1 of \d+ tensors: "
                                                 r"'model.layers.1.mlp.down_proj.weight' differs"):
            await check.after([endpoint], sent, version=2)
        await endpoint.close()
        return features, metrics

    features, metrics = asyncio.run(go())
    assert CHECKSUMS in features
    assert metrics["weight_sync/checked_engines"] == 1.0


def test_an_engine_in_another_dtype_is_compared_with_the_cast_tensors(model_dir):
    _, endpoint = _engine(model_dir, dtype="bfloat16")
    sent = _sent(model_dir)  # float32: the engine's load rounds to bfloat16, as the check's cast does
    asyncio.run(WeightCheck(timeout_s=30).after([endpoint], sent, version=1))
    asyncio.run(endpoint.close())


def test_a_tensor_the_engine_lacks_is_a_mismatch(model_dir):
    _, endpoint = _engine(model_dir)
    sent = [("model.layers.9.mlp.up_proj.weight", torch.zeros(2, 2))]
    with pytest.raises(WeightMismatch, match="'model.layers.9.mlp.up_proj.weight' is not a tensor of the engine"):
        asyncio.run(WeightCheck(timeout_s=30).after([endpoint], sent, version=1))


def test_the_hf_engine_refuses_sglangs_snapshot_actions(model_dir):
    _, endpoint = _engine(model_dir)
    with pytest.raises(WeightSyncError, match="HTTP 400: .*answers 'checksum' by HF name"):
        asyncio.run(endpoint.post("/weights_checker", {"action": "snapshot"}, 30))


class FakeSGLang:
    """An SGLang engine's /weights_checker as the check drives it."""

    def __init__(self, name: str, checksum: str = "aa", compare_ok: bool = True) -> None:
        self.name, self.checksum, self.compare_ok, self.actions = name, checksum, compare_ok, []

    def __repr__(self) -> str:
        return self.name

    async def features(self) -> frozenset[str]:
        return frozenset()  # SGLang lists none of Relax's extensions

    async def post(self, path: str, payload: dict, timeout_s: float) -> dict[str, Any]:
        assert path == "/weights_checker"
        self.actions.append(payload["action"])
        if payload["action"] == "compare" and not self.compare_ok:
            raise BucketRejected(f"{self.name}{path}: check tensor equality failed: name=model.embed_tokens.weight")
        if payload["action"] == "checksum":
            return {"success": True, "ranks": [{"per_gpu_checksum": self.checksum}]}
        return {"success": True}


def test_sglang_engines_snapshot_before_the_first_push_and_compare_after_it():
    engines, check = [FakeSGLang("e0"), FakeSGLang("e1")], WeightCheck(timeout_s=30)
    ranks = RayEndpoint(handle=None, name="actor_fwd[0]")  # a training rank: never asked

    async def push(version: int) -> None:
        await check.before([*engines, ranks], version)
        await check.after([*engines, ranks], [("w", torch.zeros(1))], version)

    asyncio.run(push(0))
    asyncio.run(push(1))
    assert [e.actions for e in engines] == [["snapshot", "reset_tensors", "compare", "checksum", "checksum"]] * 2


def test_sglang_mismatches_are_errors_not_retried_sync_failures():
    engine, check = FakeSGLang("e0", compare_ok=False), WeightCheck(timeout_s=30)
    asyncio.run(check.before([engine], 0))
    with pytest.raises(WeightMismatch, match="check tensor equality failed"):
        asyncio.run(check.after([engine], [], 0))
    with pytest.raises(WeightMismatch, match="the SGLang engines hold different weights"):
        asyncio.run(WeightCheck(timeout_s=30).after([FakeSGLang("e0"), FakeSGLang("e1", checksum="bb")], [], 3))


def test_a_resumed_run_checks_sglang_engines_for_agreement_only():
    engine, check = FakeSGLang("e0"), WeightCheck(timeout_s=30)
    asyncio.run(check.before([engine], 7))
    asyncio.run(check.after([engine], [], 7))
    assert engine.actions == ["checksum"]


def test_the_checksum_is_of_the_bytes_in_memory_order():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert tensor_checksum(t) == tensor_checksum(t.t().contiguous().t().contiguous())
    assert tensor_checksum(t) != tensor_checksum(t.to(torch.bfloat16))
    assert len(tensor_checksum(t)) == 16
