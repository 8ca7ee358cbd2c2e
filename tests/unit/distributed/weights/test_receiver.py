"""Receiving side: HF names, fused MoE experts included, load into a transformers model."""

from __future__ import annotations

import math

import torch

from relax.distributed.weights.receiver import FlatBucketPlan, WeightReceiver, hf_targets


def test_per_expert_names_load_into_fused_moe_weights(tmp_path):
    """Checkpoint names of MoE experts (what SGLang loads and the megatron backend pushes) land in
    transformers' fused expert weights; a wrong shape still rejects the bucket."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=4,
                         num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8)
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(cfg).save_pretrained(tmp_path / "a")
    torch.manual_seed(1)
    Qwen3MoeForCausalLM(cfg).save_pretrained(tmp_path / "b")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    new = load_file(str(tmp_path / "b" / "model.safetensors"))  # per-expert names
    receiver = WeightReceiver(model)
    ok, message = receiver.load_named(sorted(new.items()))
    assert ok, message
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "b").state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded[name]), name
    bad = [("model.layers.0.mlp.experts.1.up_proj.weight", torch.zeros(3, 3))]
    ok, message = receiver.load_named(bad)
    assert not ok and "model.layers.0.mlp.experts.1.up_proj.weight" in message


def _gloo_pair() -> dict:
    """A weight group "g" of two gloo ranks in this process: {0: the sender's side, 1: the receiver's}."""
    import threading

    from relax.distributed.store import listen
    from relax.distributed.weights.group import create_weight_group

    listener = listen("127.0.0.1")
    port, groups = listener.getsockname()[1], {}

    def join(rank):
        groups[rank] = create_weight_group(master_address="127.0.0.1", master_port=port, rank=rank, world_size=2,
                                           group_name="g", timeout_s=20, listener=listener if rank == 0 else None)

    joins = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    [t.start() for t in joins]
    [t.join() for t in joins]
    return groups


def test_a_session_walks_the_model_once_and_waits_only_for_its_last_flat_bucket():
    """Within a weight-update session the model's tensors are walked once, not per bucket; flat
    buckets before the last are only queued (`deferred`: no wait per bucket on a GPU), the last
    one and the session's end wait for everything queued. On this CPU the waits are counted."""
    import threading

    from relax.distributed.weights.protocol import TensorSpec, pack_flat

    class Counting(WeightReceiver):
        walks = waits = 0

        def _targets(self):
            Counting.walks += 1
            return super()._targets()

        def synchronize(self):
            Counting.waits += 1

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    new = {name: torch.randn_like(p) for name, p in model.state_dict().items()}
    buckets = [["0.weight", "0.bias"], ["1.weight"], ["1.bias"]]
    groups = _gloo_pair()
    receiver = Counting(model)
    receiver.groups["g"] = groups[1]
    receiver.open_session()
    for i, names in enumerate(buckets):
        sender = threading.Thread(target=groups[0].broadcast, args=(pack_flat([new[n] for n in names], "cpu"),))
        sender.start()
        specs = [TensorSpec(n, new[n].dtype, tuple(new[n].shape)) for n in names]
        ok, message = receiver.receive_and_load(specs, "g", flat=True, deferred=i < len(buckets) - 1)
        sender.join()
        assert ok, message
        assert Counting.waits == (1 if i == len(buckets) - 1 else 0)  # only the last bucket waited
    receiver.close_session()
    assert Counting.walks == 1 and Counting.waits == 2
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, new[name]), name


def test_a_flat_buckets_plan_is_made_once_per_walk_and_loads_every_push_exactly(monkeypatch):
    """With `cache_walk` (the hf engine), the same specs list (an armed layout's bucket, pushed every step)
    reuses its FlatBucketPlan: checked once, cut by `unflatten_dense_tensors`, copied by one
    `_foreach_copy_`; every push loads its own values; `forget_walk` (the model moved) makes a new plan;
    a bucket naming a tensor the model lacks is refused from its plan each time, its bytes taken."""
    import threading

    from relax.distributed.weights import receiver as receiver_module
    from relax.distributed.weights.protocol import FLAT_ALIGN, TensorSpec, pack_flat

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))  # 1 KiB matrices: no padding
    assert 16 * 16 * 4 % FLAT_ALIGN == 0
    names = ["0.weight", "1.weight", "1.bias"]
    specs = [TensorSpec(n, torch.float32, tuple(model.state_dict()[n].shape)) for n in names]
    bad = [TensorSpec("2.weight", torch.float32, (16, 16))]
    groups = _gloo_pair()
    receiver = WeightReceiver(model, cache_walk=True)
    receiver.groups["g"] = groups[1]
    made, checked = [], []
    monkeypatch.setattr(receiver_module, "FlatBucketPlan", lambda *a: made.append(a) or FlatBucketPlan(*a))
    real_problems = receiver.problems
    monkeypatch.setattr(receiver, "problems", lambda s: checked.append(len(s)) or real_problems(s))

    def push(bucket_specs, values):
        sender = threading.Thread(target=groups[0].broadcast, args=(pack_flat(values, "cpu"),))
        sender.start()
        result = receiver.receive_and_load(bucket_specs, "g", flat=True)
        sender.join()
        return result

    for step in range(3):
        values = [torch.full(s.shape, float(step)) for s in specs]
        ok, message = push(specs, values)
        assert ok, message
        assert all(torch.equal(model.state_dict()[n], v) for n, v in zip(names, values))
    assert len(made) == 1 and checked == [3]
    plan = receiver._flat_plan(specs)
    assert plan.cut and plan.one_copy and plan.nbytes == sum(4 * math.prod(s.shape) for s in specs)
    receiver.forget_walk()
    assert push(specs, [torch.ones(s.shape) for s in specs])[0] and len(made) == 2
    for _ in range(2):
        ok, message = push(bad, [torch.ones(16, 16)])
        assert not ok and "'2.weight' is not a parameter of the model" in message
    assert len(made) == 3 and checked == [3, 3, 1]
    assert push(specs, [torch.zeros(s.shape) for s in specs])[0]  # the group is still in step
    assert all(float(model.state_dict()[n].abs().sum()) == 0 for n in names)


def _mixed_model() -> torch.nn.Module:
    """Parameters in three dtypes and an int64 buffer: a bucket of them spans several copy groups."""
    model = torch.nn.Module()
    model.a = torch.nn.Parameter(torch.zeros(3, 5))
    model.b = torch.nn.Parameter(torch.zeros(7, dtype=torch.bfloat16))
    model.c = torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.float16))
    model.d = torch.nn.Parameter(torch.zeros(4))
    model.e = torch.nn.Parameter(torch.zeros(4, 2, dtype=torch.bfloat16))
    model.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    return model


def test_a_bucket_of_mixed_dtypes_loads_exactly_with_one_foreach_copy_per_dtype_pair(monkeypatch):
    """`load` copies a bucket in with one `torch._foreach_copy_` per (target, source) device and dtype
    pair (one kernel launch each on a GPU) and a lone pair by `copy_`; what lands is bit for bit what
    one `copy_` per tensor writes, casts included (float32 sent into bf16 and fp16 weights)."""
    from relax.distributed.weights.protocol import TensorSpec

    torch.manual_seed(0)
    sent = {"a": torch.randn(3, 5), "b": torch.randn(7), "c": torch.randn(2, 3), "d": torch.randn(4),
            "e": torch.randn(4, 2, dtype=torch.bfloat16), "steps": torch.tensor([3, 1, 4])}
    expected = _mixed_model()
    with torch.no_grad():
        for name, tensor in sent.items():  # the reference: one copy_ per tensor
            hf_targets(expected)[name].copy_(tensor)
    calls = []
    foreach = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dsts, srcs: (calls.append(len(dsts)), foreach(dsts, srcs)))
    model = _mixed_model()
    receiver = WeightReceiver(model)
    specs = [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in sent.items()]
    receiver.load(specs, list(sent.values()))
    # (f32 <- f32: a, d) (bf16 <- f32: b) (f16 <- f32: c) (bf16 <- bf16: e) (i64 <- i64: steps)
    assert calls == [2]
    for name, tensor in expected.state_dict().items():
        got = model.state_dict()[name]
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), name
    assert model.b.dtype == torch.bfloat16 and torch.equal(model.b, sent["b"].to(torch.bfloat16))


def test_a_tensor_named_twice_in_a_bucket_takes_the_last_value_as_one_copy_per_tensor_does(monkeypatch):
    """Tied weights named twice write one tensor twice: the group falls back to copies in order."""
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(4))
    model.v = model.w  # tied
    calls = []
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dsts, srcs: calls.append(len(dsts)))
    ok, message = WeightReceiver(model).load_named([("w", torch.ones(4)), ("v", torch.full((4,), 2.0))])
    assert ok, message
    assert calls == [] and torch.equal(model.w, torch.full((4,), 2.0))


class _CountingWalks(WeightReceiver):
    walks = 0

    def _targets(self):
        self.walks += 1
        return super()._targets()


def test_a_kept_walk_serves_every_push_until_it_is_forgotten_and_is_off_by_default():
    """`cache_walk` (the hf engine's): two pushes in a row walk the model once; after `forget_walk` the
    next push walks it anew and writes the model's tensors as they are now (new parameter objects, as a
    move to another device may make). Off (the training ranks): every session walks."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    kept, plain = _CountingWalks(model, cache_walk=True), _CountingWalks(model)
    for receiver in (kept, plain):
        for value in (1.0, 2.0):
            receiver.open_session()
            ok, message = receiver.load_named([("0.bias", torch.full((4,), value))])
            receiver.close_session()
            assert ok, message
        ok, message = receiver.load_named([("0.weight", torch.ones(4, 4))])  # outside a session
        assert ok, message
    assert kept.walks == 1 and plain.walks == 3
    old = model[0].bias
    model[0].bias = torch.nn.Parameter(torch.zeros(4))  # the model's tensor replaced
    kept.forget_walk()
    kept.open_session()
    ok, message = kept.load_named([("0.bias", torch.full((4,), 3.0))])
    kept.close_session()
    assert ok, message
    assert kept.walks == 2 and torch.equal(model[0].bias, torch.full((4,), 3.0))
    assert torch.equal(old, torch.full((4,), 2.0))  # (the replaced tensor was not written)
