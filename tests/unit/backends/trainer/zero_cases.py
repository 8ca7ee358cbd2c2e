"""ZeRO-1 ranks for test_host_optimizer.py (spawned: torch.distributed's default group is per process).

`run(rank, world_size, port, out)`: two gloo ranks step the same tiny model with
`build_optimizer(..., shard_group=WORLD)` under --optimizer-cpu-offload (each rank's
`HostOptimizer` holds its shard) and --overlap-param-gather (`relax.backends.megatron.param_gather`:
the step leaves the weight broadcasts in flight, the next forward waits for them); then the same with
bfloat16 model weights over float32 main weights (the casts deferred to the forward). Rank 0
writes what it saw.
"""

from __future__ import annotations

import dataclasses
import json

import torch
import torch.distributed as dist

from relax.backends.megatron.param_gather import ParamGather
from relax.backends.trainer.host_optimizer import HostOptimizer
from relax.backends.trainer.optim import build_optimizer
from relax.config.schema import OptimizerConfig

STEPS = 3
CPU = torch.device("cpu")
CFG = OptimizerConfig(lr=0.1, weight_decay=0.1, optimizer_cpu_offload=True, overlap_cpu_optimizer_d2h_h2d=True,
                      overlap_grad_reduce=True, overlap_param_gather=True)


class Tiny(torch.nn.Module):
    """Laid out as megatron's GPTModel is for ParamGather: layers under `decoder.layers`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(8, 16)
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        for layer in self.decoder.layers:
            h = torch.tanh(layer(h))
        return self.head(h)


def grads(step: int, params: list[torch.Tensor]) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def reference() -> list[list[float]]:
    """The same steps with one plain torch optimizer over every weight."""
    params = list(Tiny().parameters())
    plain = dataclasses.replace(CFG, optimizer_cpu_offload=False, overlap_cpu_optimizer_d2h_h2d=False)
    optimizer, _ = build_optimizer(params, plain, 10, CPU)
    for step in range(STEPS):
        grads(step, params)
        optimizer.step()
    return [p.detach().flatten().tolist() for p in params]


def offloaded_shards() -> dict:
    model = Tiny()
    params = list(model.parameters())
    optimizer, _ = build_optimizer(params, CFG, 10, CPU, shard_group=dist.group.WORLD)
    gather = ParamGather(optimizer, model, {})
    assert isinstance(optimizer.optim, HostOptimizer)
    mine = [i for i, p in enumerate(params) if any(p is q for c in optimizer.optim.chunks for q in c.params)]
    in_flight = []
    for step in range(STEPS):
        grads(step, params)
        optimizer.step()
        in_flight.append(gather.in_flight)  # the step returned with every broadcast still in flight
        model(torch.ones(2, 8))
        in_flight.append(gather.in_flight)  # the forward waited for them
    return {"mine": mine, "in_flight": in_flight, "after": [p.detach().flatten().tolist() for p in params]}


def bf16_casts_at_the_forward() -> dict:
    model = Tiny().bfloat16()
    main = {n: torch.nn.Parameter(p.detach().float().clone()) for n, p in model.named_parameters()}
    optimizer, _ = build_optimizer(list(main.values()), CFG, 10, CPU, shard_group=dist.group.WORLD)
    gather = ParamGather(optimizer, model, main)
    grads(0, list(main.values()))
    optimizer.step()
    gather.defer_casts(list(model.parameters()))
    named = dict(model.named_parameters())
    before = all(torch.equal(named[n], m.detach().bfloat16()) for n, m in main.items())
    model(torch.ones(2, 8, dtype=torch.bfloat16))
    after = all(torch.equal(named[n], m.detach().bfloat16()) for n, m in main.items())
    return {"cast_before_forward": before, "cast_after_forward": after, "stale": len(gather.stale)}


def run(rank: int, world_size: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = {"offloaded": offloaded_shards(), "bf16": bf16_casts_at_the_forward()}
        every = [None] * world_size
        dist.all_gather_object(every, result)
        if rank == 0:
            json.dump({"ranks": every, "reference": reference()}, open(out, "w"))
    finally:
        dist.destroy_process_group()
