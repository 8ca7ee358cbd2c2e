"""`--overlap-grad-reduce` (`relax.backends.megatron.grad_overlap`): buckets of gradients are
all-reduced during the step's last backward, in bucket order, and none during the backwards
before it (the sequential schedule's `arm`, the pipeline schedule's `no_sync`); `finish` leaves
the data-parallel mean in every gradient. One gloo rank in-process (the numbers across two and
four ranks against fsdp: test_parity.py's dp2zero and dp2pp2 cases run with the flag)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from relax.backends.megatron.grad_overlap import GradOverlap, bucket_plan
from relax.utils.net import free_port


@pytest.fixture
def group():
    if dist.is_initialized():
        pytest.skip("a process group is up in this process already")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2))


def backward(model: torch.nn.Module, seed: int) -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    model(x).square().sum().backward()


def test_buckets_run_last_parameter_first():
    assert bucket_plan([10, 10, 30, 5], 20) == [[3], [2], [1, 0]]
    assert bucket_plan([1, 2, 3], 100) == [[2, 1, 0]]


def test_buckets_launch_during_the_last_backward_only(group):
    model = mlp()
    params = list(model.parameters())
    overlap = GradOverlap([(p, p) for p in params], group, divisor=2, bucket_numel=60)
    assert [b.indices for b in overlap.buckets] == [[5, 4, 3], [2], [1, 0]]  # 2 + 16 + 8, 64, 8 + 48 elements
    overlap.arm(False)
    backward(model, 1)  # an earlier micro-batch: gradients accumulate, nothing is reduced
    assert overlap.pending == [] and overlap.ready == set()
    overlap.arm(True)
    backward(model, 2)
    assert len(overlap.pending) == 3 and overlap.in_backward == 3  # all launched while backward ran
    assert [b for b, _, _ in overlap.pending] == overlap.buckets  # in bucket order
    summed = [p.grad.clone() for p in params]
    reduced = overlap.finish()
    assert reduced == {id(p) for p in params} and overlap.last_step == (3, 3)
    for p, s in zip(params, summed):
        torch.testing.assert_close(p.grad, s / 2)  # one rank: the sum is its own; divided by the dp size
    assert overlap.pending == [] and overlap.ready == set()  # ready for the next step


def test_the_pipeline_schedule_holds_reduction_back_with_no_sync(group):
    model = mlp()
    params = list(model.parameters())
    overlap = GradOverlap([(p, p) for p in params], group, divisor=1, bucket_numel=60)
    with overlap.no_sync():  # megatron-core's schedule: every backward but the last
        backward(model, 1)
    assert overlap.pending == [] and overlap.armed
    backward(model, 2)
    assert overlap.in_backward == 3
    overlap.finish()


def test_weights_backward_did_not_reach_are_reduced_at_finish_as_zeros(group):
    """Every rank issues every bucket, in order: one this rank's rows never reached is launched at
    finish with zero gradients (its peers' may not be zero)."""
    model, unused = mlp(), torch.nn.Parameter(torch.ones(3))
    params = list(model.parameters())
    overlap = GradOverlap([(unused, unused)] + [(p, p) for p in params], group, divisor=1, bucket_numel=60)
    backward(model, 2)
    assert 0 < overlap.in_backward < len(overlap.buckets)  # the bucket holding `unused` (and after) waited
    reduced = overlap.finish()
    assert id(unused) in reduced and torch.equal(unused.grad, torch.zeros(3))
