"""The optimizer of a trained model and its learning-rate schedule.

`--optimizer` (adam/adamw: AdamW, the fused kernel on GPUs; sgd: SGD with momentum) over the
runner's optimized parameters (its float32 main weights where it keeps them); sharded over the
runner's data-parallel group (ZeRO-1, torch's `ZeroRedundancyOptimizer`: each rank steps its
share and broadcasts the updated weights) when the runner names one
(`--use-distributed-optimizer`). `reset_optimizer_state` empties it (`--reset-optimizer-states`).
The schedule is warm-up then constant, linear or cosine decay to `--min-lr`.
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


SGD_MOMENTUM = 0.9  # Megatron's --sgd-momentum default


def optimizer_kind(optim: OptimizerConfig, device: torch.device) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """`--optimizer` -> (torch optimizer class, its keyword arguments). adam and adamw are AdamW:
    Megatron's adam decouples weight decay too."""
    if optim.optimizer == "sgd":
        return torch.optim.SGD, dict(lr=optim.lr, momentum=SGD_MOMENTUM, weight_decay=optim.weight_decay)
    if optim.optimizer in ("adam", "adamw"):
        return torch.optim.AdamW, dict(lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2), eps=optim.adam_eps,
                                       weight_decay=optim.weight_decay,
                                       fused=device.type == "cuda")  # GPUs: one launch per parameter group
    raise ValueError(f"--optimizer {optim.optimizer!r}: choose adam, adamw or sgd")


def build_optimizer(params: list[torch.nn.Parameter], optim: OptimizerConfig, total_steps: int,
                    device: torch.device, shard_group: Any = None) -> tuple[Any, Any]:
    """(optimizer, LambdaLR scheduler) over `params`; `shard_group`: ZeRO-1 over that group."""
    cls, kwargs = optimizer_kind(optim, device)
    if shard_group is None:
        optimizer = cls(params, **kwargs)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=shard_group, **kwargs)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim, total_steps))


def local_optimizer(optimizer: Any) -> Any:
    """This rank's optimizer state holder (its own shard under ZeRO-1)."""
    return getattr(optimizer, "optim", optimizer)


def reset_optimizer_state(optimizer: Any) -> int:
    """`--reset-optimizer-states`: drop every parameter's state (Adam's moments and step counts,
    SGD's momentum), so the next step is a fresh optimizer's first; the learning-rate schedule
    goes on. Returns how many parameters had state."""
    local = local_optimizer(optimizer)
    dropped = len(local.state)
    local.state.clear()
    if local is not optimizer:  # ZeRO-1's wrapper mirrors its shard's state
        optimizer.state.clear()
    return dropped


def optimizer_state_tensors(optimizer: Any) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state (Adam's moments, step counters): a colocate offload
    moves them to the host (`offload.HostStash`; the state's keys are the parameters, which stay)."""
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
