"""The colocate offload's bookkeeping (relax.backends.trainer.offload.HostStash), on CPU tensors: every
distinct storage goes to a host buffer and is freed, comes back bit for bit into the same tensor
objects (views and tied weights included), host buffers are reused step after step, and gradients
and optimizer state follow the Trainer's rules. The GPU path (pinned buffers, a side stream) is the
same code with `non_blocking` copies: bench/offload.py measures it."""

from __future__ import annotations

import pytest
import torch

from relax.backends.trainer.offload import HostStash
from relax.backends.trainer.optim import optimizer_state_tensors


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: one storage behind two names
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    return model, optimizer


def test_state_goes_to_the_host_and_comes_back_into_the_same_tensors():
    model, optimizer = model_and_optimizer()
    tensors = [*model.parameters(), *optimizer_state_tensors(optimizer)]
    before = [t.detach().clone() for t in tensors]
    view = model[0].weight.data[2:4]  # a view shares the storage: it comes back too
    stash = HostStash()
    moved = stash.offload(tensors, torch.device("cpu"))
    assert moved == sum(t.numel() * t.element_size() for t in tensors)  # the tied weight once
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)  # the device memory is released
    with pytest.raises(RuntimeError, match="onload first"):
        stash.offload(tensors, torch.device("cpu"))
    assert stash.onload() == moved
    assert all(torch.equal(t, b) for t, b in zip(tensors, before))
    assert torch.equal(view, before[0][2:4]) and model[1].weight is model[0].weight
    # The optimizer steps on as if nothing happened (its state is keyed by the same parameters).
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()


def test_host_buffers_are_reused_across_steps():
    model, optimizer = model_and_optimizer()
    stash = HostStash()
    stash.offload([*model.parameters(), *optimizer_state_tensors(optimizer)], torch.device("cpu"))
    buffers = {k: id(v) for k, v in stash.hosts.items()}
    stash.onload()
    stash.offload([*model.parameters(), *optimizer_state_tensors(optimizer)], torch.device("cpu"))
    assert {k: id(v) for k, v in stash.hosts.items()} == buffers
    stash.onload()


def test_optimizer_state_lists_moments_and_step_counters():
    _, optimizer = model_and_optimizer()
    names = sorted(k for state in optimizer.state.values() for k in state)
    assert len(optimizer_state_tensors(optimizer)) == len(names) and names == ["exp_avg", "exp_avg_sq", "step"]
    assert optimizer_state_tensors(None) == []
