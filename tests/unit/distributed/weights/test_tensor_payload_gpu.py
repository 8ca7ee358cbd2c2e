"""`/update_weights_from_tensor` with real CUDA IPC handles (GPU machines only): the sender's
payloads, in both formats it writes, opened and loaded by every receiver kind in another process
on the same GPU, through `WeightReceiver.load_tensor_payload` (the CPU twin: test_tensor_payload.py).

Found on GPUs (issue 29): the fully-async quickstart's first push failed on the training ranks
with "serialized_named_tensors must hold a list of (name, tensor) pairs" (they read only the list)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_tensor_payload import megatron_module  # noqa: E402 - the CPU twin's Megatron-named module

from relax.backends.megatron.convert import Layout, hf_shapes, hf_to_megatron  # noqa: E402
from relax.distributed.weights.ipc import FLATTENED_BUCKET  # noqa: E402
from relax.distributed.weights.protocol import BucketRejected  # noqa: E402
from relax.distributed.weights.sender import WeightSender  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LAYOUT = Layout(model_type="qwen3", num_layers=2, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8,
                ffn_hidden_size=32, vocab_size=32, tied=True, qk_norm=True, qkv_bias=False)


def hf_state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in sorted(hf_shapes(LAYOUT).items())}


def build_receiver(kind: str):
    """On cuda:0: the hf engine's receiver (an HF-named model), an fsdp rank's (unsharded) or a
    megatron rank's (Megatron-named parameters, placed at TP = PP = EP = 1)."""
    import functools

    from relax.backends.fsdp.weights import ShardedWeightReceiver
    from relax.backends.megatron.convert import shard_state
    from relax.backends.megatron.weights import MegatronWeightReceiver
    from relax.distributed.weights.receiver import WeightReceiver

    device = torch.device("cuda", 0)
    state = hf_state(seed=0)
    if kind == "megatron":
        model = megatron_module(hf_to_megatron(state, LAYOUT)).to(device)
        place = functools.partial(shard_state, tp=1, tp_rank=0, layers=range(LAYOUT.num_layers), experts=None,
                                  first_stage=True, last_stage=True, tied=True)
        return MegatronWeightReceiver(model, LAYOUT, place, device=device)
    state.pop("lm_head.weight")  # tied: the HF-named model below has no alias of its own
    model = megatron_module(state).to(device)
    if kind == "fsdp":
        return ShardedWeightReceiver(model, device=device)
    return WeightReceiver(model, device=device)


def serve(kind: str, conn) -> None:
    """A receiver in its own process (as an engine or a training rank is), answering the sender's calls."""
    torch.cuda.set_device(0)
    receiver = build_receiver(kind)
    while (msg := conn.recv())[0] == "post":
        _, path, payload = msg
        if path == "/begin_weight_update":
            receiver.begin()
        if path != "/update_weights_from_tensor":
            conn.send((True, "ok"))
            continue
        try:
            conn.send(receiver.load_tensor_payload(payload))
        except ValueError as exc:
            conn.send((False, f"ValueError: {exc}"))
    # by value (numpy): a CPU tensor would travel as a file descriptor this exiting process must serve
    conn.send(({n: p.detach().cpu().numpy() for n, p in receiver.model.named_parameters()}, receiver.version))
    conn.close()


class InOtherProcess:
    def __init__(self, conn) -> None:
        self.conn, self.formats = conn, []

    async def post(self, path: str, payload: dict, timeout_s: float) -> dict:
        if path == "/update_weights_from_tensor":
            self.formats.append(payload["load_format"])
        self.conn.send(("post", path, payload))
        success, message = await asyncio.to_thread(self.conn.recv)
        if not success:
            raise BucketRejected(f"{path}: {message}")
        return {"success": True, "message": message}


@pytest.mark.parametrize("load_format", [FLATTENED_BUCKET, None], ids=["flattened_bucket", "per_tensor"])
@pytest.mark.parametrize("kind", ["hf_engine", "fsdp", "megatron"])
def test_a_receiver_on_the_senders_gpu_loads_every_format_through_ipc_handles(kind, load_format):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(kind, child))
    proc.start()
    child.close()  # the receiver's end lives in its process: a receiver that dies ends our reads
    pushed = hf_state(seed=1)
    if kind != "megatron":
        pushed.pop("lm_head.weight")  # the HF-named model ties it: no parameter of its own
    named = [(n, t.cuda()) for n, t in pushed.items()]
    if load_format is None:  # a bucket mixing dtypes cannot be one flat tensor
        named = [(n, t.double() if i % 2 else t) for i, (n, t) in enumerate(named)]
    endpoint = InOtherProcess(parent)
    sender = WeightSender([endpoint], ipc_ranks=[1], device=torch.device("cuda", 0), timeout_s=120,
                          bucket_bytes=2048 if load_format else 1 << 30, pause_mode="in_place")

    async def go() -> None:
        await sender.connect()
        try:
            await sender.push(named, version=5)
        finally:
            await sender.close()

    try:
        asyncio.run(go())
        parent.send(("state",))
        state, version = parent.recv()
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    assert set(endpoint.formats) == {load_format} and len(endpoint.formats) >= (3 if load_format else 1)
    want = hf_to_megatron(pushed, LAYOUT) if kind == "megatron" else pushed
    assert sorted(state) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(torch.from_numpy(state[name]), tensor), name
    assert str(version) == "5"
