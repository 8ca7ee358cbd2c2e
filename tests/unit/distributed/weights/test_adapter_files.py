"""The LoRA push to SGLang engines (`AdapterFileSender`): the adapter written as peft files, then SGLang
0.5.23's LoRA calls on every engine, in order and with SGLang's request fields. The engine is a fake
speaking SGLang's replies (no GPU here to run SGLang)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

from relax.distributed.weights.adapter_files import AdapterFileSender
from relax.distributed.weights.protocol import WeightSyncError
from relax.utils.peft_files import adapter_config, load_adapter

CONFIG = adapter_config(4, 8.0, ["q_proj", "v_proj"], 0.0, "/models/base")
ADAPTER = {"model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 32),
           "model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4)}


class FakeSGLang:
    """SGLang's LoRA endpoints: an adapter name loads once (unload first), unloading an unknown name fails."""

    def __init__(self, load_error: str | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.loaded: dict[str, str] = {}
        self.load_error = load_error

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.calls.append((request.url.path, body))
        if request.url.path == "/unload_lora_adapter":
            if self.loaded.pop(body["lora_name"], None) is None:
                return httpx.Response(400, json={"success": False, "error_message": "not loaded"})
        if request.url.path == "/load_lora_adapter":
            if self.load_error or body["lora_name"] in self.loaded:
                return httpx.Response(400, json={"success": False, "error_message": self.load_error or "exists"})
            self.loaded[body["lora_name"]] = body["lora_path"]
        return httpx.Response(200, json={"success": True, "message": "ok"})


def push(sender: AdapterFileSender, version: int):
    async def go():
        await sender.connect()
        try:
            return await sender.push(ADAPTER.items(), version=version)
        finally:
            await sender.close()

    return asyncio.run(go())


def sender_for(engines: list[FakeSGLang], tmp_path) -> AdapterFileSender:
    from relax.distributed.weights.endpoints import HTTPEndpoint

    endpoints = [HTTPEndpoint(f"http://engine{i}", api_key="k", transport=httpx.MockTransport(e))
                 for i, e in enumerate(engines)]
    return AdapterFileSender(endpoints, adapter_dir=str(tmp_path / "adapters"), config=CONFIG, timeout_s=30)


def test_each_push_writes_a_peft_adapter_and_swaps_it_on_every_engine(tmp_path):
    engines = [FakeSGLang(), FakeSGLang()]
    sender = sender_for(engines, tmp_path)
    for version in (1, 2, 3):
        stats = push(sender, version)
        assert stats.bytes == sum(t.numel() * 4 for t in ADAPTER.values()) and stats.version == version
    for e in engines:
        paths = [p for p, _ in e.calls]
        assert paths[:5] == ["/pause_generation", "/unload_lora_adapter", "/load_lora_adapter",
                             "/update_weight_version", "/continue_generation"]
        assert len(paths) == 15  # the same five calls per push
        load = [b for p, b in e.calls if p == "/load_lora_adapter"][-1]
        assert load == {"lora_name": "relax-policy", "lora_path": str(tmp_path / "adapters" / "v3"), "pinned": False}
        assert [b for p, b in e.calls if p == "/update_weight_version"][-1] == {"new_version": "3",
                                                                                "abort_all_requests": False}
        assert e.loaded == {"relax-policy": str(tmp_path / "adapters" / "v3")}
    config, tensors = load_adapter(tmp_path / "adapters" / "v3")
    assert config["r"] == 4 and config["target_modules"] == ["q_proj", "v_proj"] and config["peft_type"] == "LORA"
    assert all(torch.equal(tensors[n], t) for n, t in ADAPTER.items())
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v2", "v3"]  # older ones deleted
    from safetensors import safe_open

    with safe_open(str(tmp_path / "adapters" / "v3" / "adapter_model.safetensors"), "pt") as f:
        assert all(k.startswith("base_model.model.model.layers.0.") for k in f.keys())  # peft's names


def test_a_refused_load_fails_the_push_naming_the_engine_and_resumes_it(tmp_path):
    engine = FakeSGLang(load_error="LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
    with pytest.raises(WeightSyncError, match=r"http://engine0.*/load_lora_adapter .*--enable-lora"):
        push(sender_for([engine], tmp_path), 1)
    assert engine.calls[-1][0] == "/continue_generation"


def test_only_engines_take_adapter_files(tmp_path):
    class Rank:
        async def post(self, path, payload, timeout_s):
            return {"success": True}

    sender = AdapterFileSender([Rank()], adapter_dir=str(tmp_path), config=CONFIG)
    with pytest.raises(WeightSyncError, match="SGLang engines only.*--rollout-backend hf"):
        asyncio.run(sender.connect())
