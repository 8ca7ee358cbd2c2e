"""`--optimizer-cpu-offload` and `--overlap-cpu-optimizer-d2h-h2d` act on the shared optimizer
(`relax.backends.trainer.host_optimizer`, built by `optim.build_optimizer` for fsdp and megatron).

On this CPU machine the "device" is the host, so the copies are plain copies; what is checked is
what does not need a GPU: the optimizer steps float32 host copies that are not the parameters'
memory and holds its state there, the updated copies come back into the parameters, the numbers
are torch's optimizer's, the chunked schedule queues every chunk's gradient copy before stepping
and copies each chunk back before stepping the next, a checkpoint round trip continues exactly,
and under ZeRO-1 each rank offloads only its shard. Not run here (needs a GPU): pinned memory,
the side CUDA streams and their events (`Copier` with `cuda=True`)."""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest
import torch

from relax.backends.trainer.host_optimizer import HostOptimizer, chunk_plan
from relax.backends.trainer.optim import build_optimizer, optimizer_memory, reset_optimizer_state
from relax.config.schema import OptimizerConfig
from relax.utils.net import free_port

CPU = torch.device("cpu")
OFFLOAD = OptimizerConfig(lr=0.1, weight_decay=0.1, optimizer_cpu_offload=True)


def params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((4, 3), (5,), (2, 2, 2), (6,))]


def train(optimizer, ps: list[torch.nn.Parameter], steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_chunks_group_consecutive_tensors_up_to_the_budget():
    assert chunk_plan([4, 4, 4, 10, 1], 8) == [[0, 1], [2], [3], [4]]
    assert chunk_plan([], 8) == [] and chunk_plan([3, 3, 3], 100) == [[0, 1, 2]]


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_the_host_step_computes_what_torch_computes(name):
    ref_params, host_params = params(), params()
    ref, _ = build_optimizer(ref_params, OptimizerConfig(optimizer=name, lr=0.1, weight_decay=0.1), 10, CPU)
    host, _ = build_optimizer(host_params, OptimizerConfig(optimizer=name, lr=0.1, weight_decay=0.1,
                                                           optimizer_cpu_offload=True), 10, CPU)
    assert isinstance(host, HostOptimizer) and type(ref) is not HostOptimizer
    train(ref, ref_params, 3)
    train(host, host_params, 3)
    for a, b in zip(ref_params, host_params):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_the_state_lives_in_host_copies_not_in_the_parameters():
    ps = params()
    optimizer, _ = build_optimizer(ps, OFFLOAD, 10, CPU)
    (chunk,) = optimizer.chunks  # one chunk without --overlap-cpu-optimizer-d2h-h2d
    for p, host in zip(ps, chunk.hosts):
        assert host.dtype == torch.float32 and host.device.type == "cpu"
        assert host.untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
    train(optimizer, ps, 1)
    for p, host in zip(ps, chunk.hosts):
        state = optimizer.state[p]  # keyed by the device parameter, as torch's optimizers are
        assert state["exp_avg"] is chunk.inner.state[host]["exp_avg"]
        assert torch.equal(p.detach(), host)  # the updated copy came back into the parameter
    memory = optimizer_memory(optimizer)
    assert memory == {"optimizer/state_host_gib": sum(2 * 4 * p.numel() for p in ps) / (1 << 30)}
    assert reset_optimizer_state(optimizer) == len(ps) and len(optimizer.state) == 0


def test_overlap_steps_each_chunk_as_its_copy_lands_and_sends_it_back_before_the_next():
    ps = params()
    optimizer = HostOptimizer(ps, inner=torch.optim.AdamW, overlap=True, chunk_bytes=64, lr=0.1, weight_decay=0.0)
    assert [len(c.params) for c in optimizer.chunks] == [1, 2, 1]  # 48, 20 + 32, 24 bytes
    train(optimizer, ps, 1)
    assert optimizer.last_schedule == [("d2h", 0), ("d2h", 1), ("d2h", 2), ("step", 0), ("h2d", 0),
                                       ("step", 1), ("h2d", 1), ("step", 2), ("h2d", 2)]
    flat = params()
    ref, _ = build_optimizer(flat, OptimizerConfig(lr=0.1), 10, CPU)
    train(ref, flat, 1)
    for a, b in zip(flat, ps):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_the_lr_schedule_reaches_the_host_optimizers():
    ps = params()
    optimizer, scheduler = build_optimizer(ps, OptimizerConfig(lr=0.1, lr_warmup_iters=4, optimizer_cpu_offload=True,
                                                               overlap_cpu_optimizer_d2h_h2d=True), 10, CPU)
    train(optimizer, ps, 1)
    assert [c.inner.param_groups[0]["lr"] for c in optimizer.chunks] == pytest.approx([0.025] * len(optimizer.chunks))
    scheduler.step()
    train(optimizer, ps, 1)
    assert [c.inner.param_groups[0]["lr"] for c in optimizer.chunks] == pytest.approx([0.05] * len(optimizer.chunks))


def test_a_checkpoint_round_trip_continues_exactly_and_takes_the_loaded_weights():
    ps = params()
    optimizer, _ = build_optimizer(ps, OFFLOAD, 10, CPU)
    train(optimizer, ps, 2)
    saved, weights = copy.deepcopy(optimizer.state_dict()), [p.detach().clone() for p in ps]  # as on disk
    train(optimizer, ps, 2, seed=7)
    uninterrupted = [p.detach().clone() for p in ps]

    resumed = params()  # a new rank: fresh weights and optimizer, then the checkpoint
    optimizer, _ = build_optimizer(resumed, OFFLOAD, 10, CPU)
    with torch.no_grad():
        for p, w in zip(resumed, weights):
            p.copy_(w)
    optimizer.load_state_dict(saved)  # the host copies take the loaded weights too
    train(optimizer, resumed, 2, seed=7)
    for a, b in zip(uninterrupted, resumed):
        assert torch.equal(a, b.detach())


def test_under_zero1_each_rank_offloads_its_shard_and_the_next_forward_waits_for_the_broadcast(tmp_path, rank_pool):
    """Two gloo ranks (tests/rank_pool.py, `zero_cases.py`), ZeRO-1 under --optimizer-cpu-offload and
    --overlap-param-gather: disjoint host shards; each step returns with the weight broadcasts in
    flight and the next forward waits for them; the weights are the plain optimizer's on both
    ranks; under --bf16 the main weights' casts happen at the forward too."""
    sys.path.insert(0, os.path.dirname(__file__))
    import zero_cases

    out, port = str(tmp_path / "zero.json"), free_port()
    rank_pool.run(zero_cases.run, [(r, 2, port, out) for r in range(2)], 120, "ZeRO-1 ranks")
    result = json.load(open(out))
    ranks = [r["offloaded"] for r in result["ranks"]]
    assert sorted(ranks[0]["mine"] + ranks[1]["mine"]) == list(range(8)) and ranks[0]["mine"] and ranks[1]["mine"]
    for r in ranks:
        assert r["in_flight"] == [8, 0] * zero_cases.STEPS  # eight weights broadcast per step, waited at the forward
        for a, b in zip(r["after"], result["reference"]):
            assert a == pytest.approx(b, abs=1e-6)
    for r in result["ranks"]:
        assert r["bf16"] == {"cast_before_forward": False, "cast_after_forward": True, "stale": 0}
