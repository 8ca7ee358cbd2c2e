"""The optimizer of a trained model and its learning-rate schedule.

`--optimizer` (adam/adamw: AdamW, the fused kernel on GPUs; sgd: SGD with momentum) over the
runner's optimized parameters (its float32 main weights where it keeps them); sharded over the
runner's data-parallel group (ZeRO-1, torch's `ZeroRedundancyOptimizer`: each rank steps its
share and broadcasts the updated weights) when the runner names one
(`--use-distributed-optimizer`). `reset_optimizer_state` empties it (`--reset-optimizer-states`).
The schedule is warm-up then constant, linear or cosine decay to `--min-lr`.

Two flags change where and in what precision the state lives, for both backends (composed with
ZeRO-1: each rank's shard): `--use-precision-aware-optimizer` keeps Adam's moments in bfloat16
(`lowp_adam.py`), `--optimizer-cpu-offload` keeps the state on the host and steps it there
(`host_optimizer.py`, with `--overlap-cpu-optimizer-d2h-h2d` its copies overlap the step).
`optimizer_memory` reports where the state is and what the bfloat16 moments saved.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import torch

from relax.backends.trainer.host_optimizer import HostOptimizer, host_optimizers
from relax.backends.trainer.lowp_adam import MOMENTS, LowPrecisionAdamW, moment_bytes_saved
from relax.config.schema import OptimizerConfig

logger = logging.getLogger(__name__)
GIB = float(1 << 30)


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
    if optim.optimizer not in ("adam", "adamw"):
        raise ValueError(f"--optimizer {optim.optimizer!r}: choose adam, adamw or sgd")
    adam = dict(lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2), eps=optim.adam_eps,
                weight_decay=optim.weight_decay)
    if optim.use_precision_aware_optimizer:  # bfloat16 moments, float32 math (lowp_adam.py)
        return LowPrecisionAdamW, adam
    # GPUs: one launch per parameter group; the host (--optimizer-cpu-offload): torch's fused CPU AdamW
    return torch.optim.AdamW, {**adam, "fused": device.type == "cuda" or optim.optimizer_cpu_offload}


def build_optimizer(params: list[torch.nn.Parameter], optim: OptimizerConfig, total_steps: int,
                    device: torch.device, shard_group: Any = None) -> tuple[Any, Any]:
    """(optimizer, LambdaLR scheduler) over `params`; `shard_group`: ZeRO-1 over that group."""
    cls, kwargs = optimizer_kind(optim, device)
    if optim.optimizer_cpu_offload:  # the state and the step on the host (host_optimizer.py)
        cls = functools.partial(HostOptimizer, inner=cls, overlap=optim.overlap_cpu_optimizer_d2h_h2d)
    if shard_group is None:
        optimizer = cls(params, **kwargs)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=shard_group, **kwargs)
    log_placement(optimizer, optim)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim, total_steps))


def log_placement(optimizer: Any, optim: OptimizerConfig) -> None:
    """One line saying where this rank's optimizer state lives and, with bfloat16 moments, what they save."""
    if not (optim.optimizer_cpu_offload or optim.use_precision_aware_optimizer):
        return
    local = local_optimizer(optimizer)
    params = [p for g in local.param_groups for p in g["params"]]
    where = "the host (its step too)" if optim.optimizer_cpu_offload else "the device"
    saved = moment_bytes_saved(params) if optim.use_precision_aware_optimizer else 0
    logger.info("optimizer state of %d parameter tensors on %s%s", len(params), where,
                f"; Adam moments in bfloat16 save {saved / GIB:.3f} GiB" if saved else "")


def refresh_host_copies(optimizer: Any) -> None:
    """--optimizer-cpu-offload: the host copies take the device parameters after a load (a no-op otherwise)."""
    for host in host_optimizers(optimizer):
        host.refresh_host_copies()


def optimizer_memory(optimizer: Any) -> dict[str, float]:
    """This rank's optimizer state in GiB, named by where it lives (`optimizer/state_host_gib` under
    --optimizer-cpu-offload, else `optimizer/state_device_gib`), and what moments kept below float32
    (--use-precision-aware-optimizer) saved (`optimizer/moments_saved_gib`)."""
    if optimizer is None:
        return {}
    total = saved = 0
    for state in local_optimizer(optimizer).state.values():
        for name, t in state.items():
            if not isinstance(t, torch.Tensor) or t.dim() == 0:  # the step count
                continue
            t = t.to_local() if hasattr(t, "to_local") else t  # FSDP2: this rank's shard
            total += t.numel() * t.element_size()
            if name in MOMENTS and t.element_size() < 4:
                saved += t.numel() * (4 - t.element_size())
    out = {f"optimizer/state_{'host' if host_optimizers(optimizer) else 'device'}_gib": total / GIB}
    return out | ({"optimizer/moments_saved_gib": saved / GIB} if saved else {})


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

