"""`--use-precision-aware-optimizer`: AdamW with bfloat16 moments (`relax.backends.trainer.lowp_adam`).

The update is torch's AdamW computed in float32; only the moments carried between steps are
rounded to bfloat16. With float32 moments it is torch's AdamW; with bfloat16 ones it stays within
bfloat16 reach of it, and the moments take half the bytes (reported by `optimizer_memory`)."""

from __future__ import annotations

import pytest
import torch

from relax.backends.trainer.lowp_adam import LowPrecisionAdamW, adamw_update_, moment_bytes_saved
from relax.backends.trainer.optim import build_optimizer, optimizer_memory
from relax.config.schema import OptimizerConfig

CPU = torch.device("cpu")
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def weights_and_grads(steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 32, generator=g), [torch.randn(64, 32, generator=g) * (1 + s) for s in range(steps)]


def torch_adamw(w0: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([p], foreach=False, **HYPER)
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
    return p.detach()


def pure(w0: torch.Tensor, grads: list[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    w, m, v = w0.clone(), torch.zeros_like(w0, dtype=dtype), torch.zeros_like(w0, dtype=dtype)
    b1, b2 = HYPER["betas"]
    for t, grad in enumerate(grads, start=1):
        adamw_update_(w, grad, m, v, step=t, lr=HYPER["lr"], beta1=b1, beta2=b2, eps=HYPER["eps"],
                      weight_decay=HYPER["weight_decay"])
    return w, m


def test_float32_moments_are_torch_adamw():
    w0, grads = weights_and_grads(5)
    w, m = pure(w0, grads, torch.float32)
    assert m.dtype == torch.float32
    torch.testing.assert_close(w, torch_adamw(w0, grads), atol=1e-6, rtol=0)


def test_bfloat16_moments_stay_within_bfloat16_reach_of_adamw():
    w0, grads = weights_and_grads(10)
    w, m = pure(w0, grads, torch.bfloat16)
    ref = torch_adamw(w0, grads)
    assert m.dtype == torch.bfloat16
    moved = (ref - w0).abs().mean()
    # each step moves a weight by about lr; bf16 moments (8-bit mantissa) perturb it by ~2^-9 of that per step
    assert (w - ref).abs().max() < 10 * HYPER["lr"] * 2 ** -7
    assert (w - ref).abs().max() < 0.05 * moved
    assert not torch.equal(w, ref)  # the rounding is real


def test_the_optimizer_class_keeps_adamw_state_names_in_bfloat16():
    w0, grads = weights_and_grads(3)
    p = torch.nn.Parameter(w0.clone())
    opt = LowPrecisionAdamW([p], **HYPER)
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
    state = opt.state[p]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"} and int(state["step"]) == 3
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    torch.testing.assert_close(p.detach(), pure(w0, grads, torch.bfloat16)[0], atol=0, rtol=0)


def test_the_flag_builds_it_and_the_saving_is_reported():
    p = torch.nn.Parameter(torch.zeros(1000))
    optimizer, _ = build_optimizer([p], OptimizerConfig(use_precision_aware_optimizer=True), 4, CPU)
    assert type(optimizer) is LowPrecisionAdamW
    p.grad = torch.ones(1000)
    optimizer.step()
    memory = optimizer_memory(optimizer)
    assert memory["optimizer/state_device_gib"] * (1 << 30) == 2 * 1000 * 2  # two bf16 moments
    assert memory["optimizer/moments_saved_gib"] * (1 << 30) == moment_bytes_saved([p]) == 4000
    plain, _ = build_optimizer([torch.nn.Parameter(torch.zeros(3))], OptimizerConfig(), 4, CPU)
    assert type(plain) is torch.optim.AdamW


def test_sgd_has_no_precision_aware_form(base):
    from relax.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="--use-precision-aware-optimizer.*--optimizer sgd"):
        parse_config(base + ["--use-precision-aware-optimizer", "--optimizer", "sgd"])
