"""--recompute-loss-function (`relax.backends.megatron.head`): the vocabulary-parallel head under
activation checkpointing keeps no `[tokens, vocab]` logits for backward and gives the same log-probs,
entropies and gradients as without it. One process, a one-rank tensor group (gloo); two ranks with the
flag train as fsdp does in test_parity.py's tp2sp dense case."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from relax.backends.megatron.head import MegatronResponseHead  # noqa: E402
from relax.utils.net import free_port  # noqa: E402

N, H, V = 32, 4, 64  # logits [N, V] outnumber the hidden states and the weight that are kept instead


@pytest.fixture(scope="module")
def group():
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD
    if started:
        dist.destroy_process_group()


def run_head(group, recompute: bool):
    """(log-probs, entropies, grads of hidden and weight, saved numels) of one forward and backward."""
    torch.manual_seed(0)
    hidden = torch.randn(N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (N,))
    head = MegatronResponseHead(torch.nn.Linear(H, V), torch.arange(N)[None], torch.ones(1, N), targets[None],
                                temperature=0.7, chunk=None, entropy=True, entropy_grad=True, tp_group=group,
                                tp_rank=0, tp_size=2, sequence_parallel=True, recompute=recompute)
    saved: list[int] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logp, ent = head.vocab_parallel(hidden, weight, targets)
    (logp.sum() + 0.1 * ent.sum()).backward()
    return logp.detach(), ent.detach(), hidden.grad, weight.grad, saved


def test_recomputed_head_keeps_no_logits_and_gives_the_same_numbers(group):
    logp, ent, grad_h, grad_w, saved = run_head(group, recompute=False)
    logp_r, ent_r, grad_h_r, grad_w_r, saved_r = run_head(group, recompute=True)
    assert max(saved) >= N * V  # without: the float32 logits (and their softmax) are kept for backward
    assert max(saved_r, default=0) < N * V and sum(saved_r) < sum(saved)
    for a, b in ((logp, logp_r), (ent, ent_r), (grad_h, grad_h_r), (grad_w, grad_w_r)):
        assert torch.equal(a, b)
