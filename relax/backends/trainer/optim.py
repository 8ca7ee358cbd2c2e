"""The optimizer of a trained model and its learning-rate schedule.

AdamW over the runner's optimized parameters (its float32 main weights where it keeps them),
the fused kernel on GPUs; sharded over the runner's data-parallel group (ZeRO-1, torch's
`ZeroRedundancyOptimizer`: each rank steps its share and broadcasts the updated weights) when
the runner names one (`--use-distributed-optimizer`). The schedule is warm-up then constant,
linear or cosine decay to `--min-lr`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from relax.config.schema import OptimizerConfig


def lr_lambda(optim: OptimizerConfig, total_steps: int):
    """Warm-up then constant / linear / cosine decay to min_lr, as a LambdaLR factor."""
    decay_steps = max(1, (optim.lr_decay_iters or total_steps) - optim.lr_warmup_iters)
    floor = optim.min_lr / optim.lr if optim.lr else 0.0

    def factor(step: int) -> float:
        if step < optim.lr_warmup_iters:
            return (step + 1) / optim.lr_warmup_iters
        progress = min(1.0, (step - optim.lr_warmup_iters) / decay_steps)
        if optim.lr_decay_style == "linear":
            return floor + (1 - floor) * (1 - progress)
        if optim.lr_decay_style == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return factor


def build_optimizer(params: list[torch.nn.Parameter], optim: OptimizerConfig, total_steps: int,
                    device: torch.device, shard_group: Any = None) -> tuple[Any, Any]:
    """(optimizer, LambdaLR scheduler) over `params`; `shard_group`: ZeRO-1 over that group."""
    o = optim
    kwargs = dict(lr=o.lr, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps, weight_decay=o.weight_decay,
                  fused=device.type == "cuda")  # GPUs: one launch per parameter group, not several per tensor
    if shard_group is None:
        optimizer = torch.optim.AdamW(params, **kwargs)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=shard_group,
                                            **kwargs)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, total_steps))


def local_optimizer(optimizer: Any) -> Any:
    """This rank's optimizer state holder (its own shard under ZeRO-1)."""
    return getattr(optimizer, "optim", optimizer)


def optimizer_state_tensors(optimizer: Any) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state (Adam's moments, step counters): a colocate offload
    moves them to the host (`offload.HostStash`; the state's keys are the parameters, which stay)."""
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
