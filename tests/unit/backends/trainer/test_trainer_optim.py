"""`--optimizer` and `--reset-optimizer-states` act on the optimizer every trained model gets
(`relax.backends.trainer.optim`, shared by the fsdp and megatron runners): the class built and
its update, and the state a reset drops."""

from __future__ import annotations

import pytest
import torch

from relax.backends.trainer.optim import SGD_MOMENTUM, build_optimizer, reset_optimizer_state
from relax.config.schema import OptimizerConfig

CPU = torch.device("cpu")


def one_param() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor([1.0, -2.0]))


def step(optimizer, param: torch.nn.Parameter, grad: list[float]) -> torch.Tensor:
    before = param.detach().clone()
    param.grad = torch.tensor(grad)
    optimizer.step()
    return param.detach() - before


@pytest.mark.parametrize("name, cls", [("adam", torch.optim.AdamW), ("adamw", torch.optim.AdamW),
                                       ("sgd", torch.optim.SGD)])
def test_the_optimizer_flag_picks_the_class(name, cls):
    optimizer, _ = build_optimizer([one_param()], OptimizerConfig(optimizer=name, lr=0.1), 10, CPU)
    assert type(optimizer) is cls
    if name == "sgd":
        assert optimizer.defaults["momentum"] == SGD_MOMENTUM


def test_sgd_and_adam_update_differently():
    """Adam's first step moves each weight by about lr whatever the gradient's size; SGD by lr x grad."""
    grad = [0.5, -4.0]
    for name, expected in (("adam", [-0.1, 0.1]), ("sgd", [-0.05, 0.4])):
        param = one_param()
        optimizer, _ = build_optimizer([param], OptimizerConfig(optimizer=name, lr=0.1), 10, CPU)
        assert torch.allclose(step(optimizer, param, grad), torch.tensor(expected), atol=1e-5), name


def test_reset_drops_the_state_so_the_next_step_is_a_first_step():
    cfg = OptimizerConfig(optimizer="sgd", lr=0.1)
    param = one_param()
    optimizer, _ = build_optimizer([param], cfg, 10, CPU)
    step(optimizer, param, [1.0, 1.0])
    kept = step(optimizer, param, [1.0, 1.0])  # momentum: 0.1 * (1 + 0.9)
    assert torch.allclose(kept, torch.tensor([-0.19, -0.19]))
    assert reset_optimizer_state(optimizer) == 1 and not optimizer.state
    fresh = step(optimizer, param, [1.0, 1.0])  # no momentum left: 0.1 * 1
    assert torch.allclose(fresh, torch.tensor([-0.1, -0.1]))
    assert reset_optimizer_state(optimizer) == 1


def test_weight_decay_and_adam_betas_reach_the_optimizer():
    """--weight-decay (decoupled: a zero gradient still shrinks the weights by lr x wd), and
    --adam-beta1 / --adam-beta2 / --adam-eps as AdamW's."""
    param = one_param()
    cfg = OptimizerConfig(optimizer="adamw", lr=0.1, weight_decay=0.5, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-6)
    optimizer, _ = build_optimizer([param], cfg, 10, CPU)
    assert optimizer.defaults["betas"] == (0.8, 0.95) and optimizer.defaults["eps"] == 1e-6
    assert torch.allclose(step(optimizer, param, [0.0, 0.0]), torch.tensor([-0.05, 0.1]))
