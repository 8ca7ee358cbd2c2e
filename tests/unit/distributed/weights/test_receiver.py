"""Receiving side: HF names, fused MoE experts included, load into a transformers model."""

from __future__ import annotations

import torch

from relax.distributed.weights.receiver import WeightReceiver


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


def test_a_session_walks_the_model_once_and_waits_only_for_its_last_flat_bucket():
    """Within a weight-update session the model's tensors are walked once, not per bucket; flat
    buckets before the last are only queued (`deferred`: no wait per bucket on a GPU), the last
    one and the session's end wait for everything queued. On this CPU the waits are counted."""
    import threading

    from relax.distributed.store import listen
    from relax.distributed.weights.group import create_weight_group
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
    listener = listen("127.0.0.1")
    port, groups = listener.getsockname()[1], {}

    def join(rank):
        groups[rank] = create_weight_group(master_address="127.0.0.1", master_port=port, rank=rank, world_size=2,
                                           group_name="g", timeout_s=20, listener=listener if rank == 0 else None)

    joins = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    [t.start() for t in joins]
    [t.join() for t in joins]
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
