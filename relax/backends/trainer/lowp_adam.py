"""`--use-precision-aware-optimizer`: AdamW whose moments are stored in bfloat16.

Adam keeps two moments per weight (exp_avg, exp_avg_sq): 8 of the 16 bytes per weight that a
float32 AdamW holds beside the model (weight, gradient, two moments). Megatron's precision-aware
optimizer (Transformer Engine's FusedAdam with `exp_avg_dtype` / `exp_avg_sq_dtype` bf16) stores
them in a low precision and computes in float32 with float32 main weights; this is the same
update in plain torch ops, on any device (the host too, under --optimizer-cpu-offload):

    m  = beta1 m + (1 - beta1) g                 read as float32 from its bf16 copy
    v  = beta2 v + (1 - beta2) g^2               (likewise)
    w -= lr wd w                                 decoupled weight decay (AdamW)
    w -= lr / (1 - beta1^t) m / (sqrt(v / (1 - beta2^t)) + eps)
    store m, v back in bf16 (round to nearest)

The weight update uses the float32 moments of this step; only what is carried to the next step is
rounded (bf16 keeps 8 bits of mantissa: a relative error of at most 2^-9 per stored moment). Half
the moments' memory: 4 bytes per weight saved (`moment_bytes_saved`). Simplification: no
stochastic rounding, no AMSGrad, no `maximize`.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

MOMENTS = ("exp_avg", "exp_avg_sq")


@torch.no_grad()
def adamw_update_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                  step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One AdamW step of `param` in place (`step` counts from 1). `exp_avg` / `exp_avg_sq` (the
    shape of `param`, any floating dtype) are read as float32, updated, and stored back in their
    own dtype; `param` (float32) takes the update computed from the float32 moments."""
    g = grad.float()
    m = exp_avg.float().mul_(beta1).add_(g, alpha=1 - beta1)
    v = exp_avg_sq.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
    param.mul_(1 - lr * weight_decay)
    bias1, bias2 = 1 - beta1 ** step, 1 - beta2 ** step
    denom = (v.sqrt() / math.sqrt(bias2)).add_(eps)
    param.addcdiv_(m, denom, value=-lr / bias1)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)



def closure_loss(closure: Any) -> Any:
    """`Optimizer.step(closure)`'s contract: re-evaluate the loss with gradients on, if given."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class LowPrecisionAdamW(torch.optim.Optimizer):
    """AdamW (`adamw_update_`) with its moments in `moments_dtype` (bfloat16); the state keeps
    torch's AdamW names (`step`, `exp_avg`, `exp_avg_sq`), so checkpoints look like AdamW's.
    Subclasses `torch.optim.Optimizer` because the LR scheduler and ZeRO-1 require one."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, moments_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      moments_dtype=moments_dtype))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure_loss(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    for name in MOMENTS:
                        state[name] = torch.zeros_like(p, dtype=group["moments_dtype"])
                state["step"] += 1
                adamw_update_(p, p.grad, state["exp_avg"], state["exp_avg_sq"], step=int(state["step"]),
                              lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                              weight_decay=group["weight_decay"])
        return loss


def moment_bytes_saved(params: Iterable[torch.Tensor], moments_dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes the moments of `params` take less than float32 moments would (two moments per weight)."""
    per = 4 - torch.finfo(moments_dtype).bits // 8
    return sum(2 * per * (p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)  # FSDP2: the shard
