"""`/update_weights_from_tensor` on CPU: every format the sender writes is read by every receiver.

CUDA IPC itself needs a GPU; what is around it does not. The sender's own encoding (a
`WeightSender` whose receiver shares its device, `ipc_ranks=[1]`, with a pass-through serializer)
builds the payloads from CPU tensors, in both formats it writes: SGLang's flattened bucket (the
bucket's tensors share a dtype) and the (name, tensor) list (they do not). Each receiver kind reads
them with the one decode every receiver uses (`WeightReceiver.load_tensor_payload`, a pass-through
deserializer) and must hold the pushed weights and version after: the hf engine's receiver, an fsdp
rank's (`ShardedWeightReceiver`, unsharded model) and a megatron rank's (`MegatronWeightReceiver`
on a model with Megatron's names, placed by `shard_state` at TP = PP = EP = 1).

Found on GPUs (issue 29): a training rank decoded only the list format, so the fully-async
quickstart's first push (flattened buckets) failed with "serialized_named_tensors must hold a list
of (name, tensor) pairs".
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

import pytest
import torch

from relax.backends.fsdp.weights import ShardedWeightReceiver
from relax.backends.megatron.convert import Layout, hf_to_megatron, shard_state
from relax.backends.megatron.weights import MegatronWeightReceiver
from relax.distributed.weights.ipc import FLATTENED_BUCKET, decode_tensor_payload, encode_bucket, tensor_payload
from relax.distributed.weights.protocol import BucketRejected
from relax.distributed.weights.receiver import WeightReceiver
from relax.distributed.weights.sender import WeightSender

VERSION = 7


def passthrough(obj: Any) -> Any:
    return obj


def decode_and_load(receiver: Any, payload: dict) -> tuple[bool, str]:
    """What every receiver runs on an `/update_weights_from_tensor` payload."""
    return receiver.load_tensor_payload(payload, deserializer=passthrough)


class SameDevice:
    """A receiver on the sender's device as the sender sees it: tensor payloads go to
    `decode_and_load`; the pause / session / resume calls have nothing to do here."""

    def __init__(self, receiver: Any) -> None:
        self.receiver, self.formats = receiver, []

    async def post(self, path: str, payload: dict, timeout_s: float) -> dict:
        if path != "/update_weights_from_tensor":
            return {"success": True, "message": "ok"}
        self.formats.append(payload["load_format"])
        success, message = decode_and_load(self.receiver, payload)
        if not success:
            raise BucketRejected(f"{path}: {message}")
        return {"success": True, "message": message}


def tiny_qwen3(seed: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                                        tie_word_embeddings=True))


def megatron_module(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module whose parameters carry Megatron's global names (what `named_parameters` of a
    megatron-core GPTModel gives on one rank), holding `state`."""
    root = torch.nn.Module()
    for name, tensor in state.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]
        module.register_parameter(leaf, torch.nn.Parameter(tensor.clone()))
    return root


def make_receiver(kind: str) -> tuple[Any, Callable[[], dict[str, torch.Tensor]], Callable]:
    """(receiver, its model's state now, what that state must be once `hf_state` is pushed)."""
    model = tiny_qwen3(seed=0)
    if kind == "hf_engine":
        return WeightReceiver(model), model.state_dict, lambda hf: hf
    if kind == "fsdp":
        return ShardedWeightReceiver(model, device=torch.device("cpu")), model.state_dict, lambda hf: hf
    layout = Layout.from_hf_config(model.config)
    mg = megatron_module(hf_to_megatron(model.state_dict(), layout))
    place = functools.partial(shard_state, tp=1, tp_rank=0, layers=range(layout.num_layers), experts=None,
                              first_stage=True, last_stage=True, tied=layout.tied)
    receiver = MegatronWeightReceiver(mg, layout, place, device=torch.device("cpu"))
    return receiver, lambda: {n: p.detach() for n, p in mg.named_parameters()}, lambda hf: hf_to_megatron(hf, layout)


def pushed_weights(load_format: str | None) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """Other weights in checkpoint names, and a bucket size that yields `load_format`: small
    one-dtype buckets (fused Megatron tensors straddle them) for the flattened bucket; one bucket
    mixing float32 and float64 (a flat tensor holds one dtype) for the list."""
    named = sorted(tiny_qwen3(seed=1).state_dict().items())
    if load_format == FLATTENED_BUCKET:
        return named, 3000
    return [(n, t.double() if i % 2 else t) for i, (n, t) in enumerate(named)], 1 << 30


def push(receiver: Any, named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> SameDevice:
    endpoint = SameDevice(receiver)
    sender = WeightSender([endpoint], ipc_ranks=[1], serializer=passthrough, bucket_bytes=bucket_bytes,
                          timeout_s=60, pause_mode="in_place")

    async def go() -> None:
        await sender.connect()
        try:
            await sender.push(named, version=VERSION)
        finally:
            await sender.close()

    asyncio.run(go())
    return endpoint


@pytest.mark.parametrize("load_format", [FLATTENED_BUCKET, None], ids=["flattened_bucket", "per_tensor"])
@pytest.mark.parametrize("kind", ["hf_engine", "fsdp", "megatron"])
def test_every_receiver_loads_every_format_the_sender_writes(kind, load_format):
    receiver, state, expected = make_receiver(kind)
    named, bucket_bytes = pushed_weights(load_format)
    want = expected({n: t.float() for n, t in named})
    assert any(not torch.equal(state()[n], t) for n, t in want.items())  # the push must change something

    endpoint = push(receiver, named, bucket_bytes)

    assert set(endpoint.formats) == {load_format} and endpoint.formats  # the format under test was sent
    got = state()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert str(receiver.version) == str(VERSION)


def test_the_sender_writes_a_flattened_bucket_for_one_dtype_and_the_list_for_several():
    one = [("a", torch.ones(2, 3)), ("b", torch.arange(4.0))]
    bucket, load_format = encode_bucket(one)
    assert load_format == FLATTENED_BUCKET and bucket["flattened_tensor"].shape == (10,)
    payload = tensor_payload(bucket, load_format, copies=2, weight_version="3", serializer=passthrough)
    assert len(payload["serialized_named_tensors"]) == 2 and payload["weight_version"] == "3"
    named, flat = decode_tensor_payload(payload, passthrough)
    assert [n for n, _ in named] == ["a", "b"] and flat is bucket["flattened_tensor"]
    assert all(torch.equal(t, dict(one)[n]) for n, t in named)

    mixed = [("a", torch.ones(2)), ("b", torch.ones(2, dtype=torch.float64))]
    bucket, load_format = encode_bucket(mixed)
    assert load_format is None and bucket == mixed
    named, flat = decode_tensor_payload(tensor_payload(bucket, None, copies=1, weight_version=None,
                                                       serializer=passthrough), passthrough)
    assert named == mixed and flat is None


def test_a_payload_in_an_unknown_format_or_without_tensors_is_refused_before_loading():
    receiver = WeightReceiver(tiny_qwen3(seed=0))
    with pytest.raises(ValueError, match="load_format='direct' is not supported"):
        receiver.load_tensor_payload({"serialized_named_tensors": ["x"], "load_format": "direct"},
                                     deserializer=passthrough)
    with pytest.raises(ValueError, match="non-empty list"):
        receiver.load_tensor_payload({"serialized_named_tensors": []}, deserializer=passthrough)
    with pytest.raises(ValueError, match=r"list of \(name, tensor\) pairs"):  # a flat bucket sent as a list
        receiver.load_tensor_payload({"serialized_named_tensors": [encode_bucket([("a", torch.ones(1))])[0]]},
                                     deserializer=passthrough)


def test_a_bucket_that_does_not_fit_is_refused_whole_and_its_version_not_taken():
    receiver = WeightReceiver(tiny_qwen3(seed=0))
    bucket, load_format = encode_bucket([("model.norm.weight", torch.zeros(32)), ("lm_head.weight", torch.zeros(3))])
    payload = tensor_payload(bucket, load_format, copies=1, weight_version="9", serializer=passthrough)
    success, message = receiver.load_tensor_payload(payload, hold=True, deserializer=passthrough)
    assert not success and "'lm_head.weight' has shape [3]" in message
    assert receiver.version is None and receiver.held is None
    assert not torch.equal(receiver.model.model.norm.weight, torch.zeros(32))  # nothing loaded


def test_the_engine_holds_a_flattened_bucket_open_only_when_asked():
    receiver = WeightReceiver(tiny_qwen3(seed=0))
    bucket, load_format = encode_bucket([("model.norm.weight", torch.zeros(32))])
    payload = tensor_payload(bucket, load_format, copies=1, weight_version=None, serializer=passthrough)
    assert receiver.load_tensor_payload(payload, hold=True, deserializer=passthrough)[0]
    assert receiver.held is bucket["flattened_tensor"] and receiver.version is None
    assert receiver.load_tensor_payload(payload, deserializer=passthrough)[0] and receiver.held is None
