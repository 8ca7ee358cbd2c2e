"""Gradients of a megatron rank before the optimizer step: reduction over the parallel groups and
the global norm (with clipping).

Reduction averages over data-parallel ranks: dense weights over the data-parallel group, expert
weights over their expert-data-parallel group (each expert rank already summed the gradients of
every token routed to it), both divided by the data-parallel size; with --sequence-parallel the
norms' partial gradients are summed over the tensor group. Under context parallelism each rank's
gradient is its chunks' share of the same loss: summed over the context-parallel ranks too
(megatron's data-parallel-with-CP group, which the expert-data-parallel group also spans), still
divided by the data-parallel size only. The norm counts every weight once across tensor and
expert shards and pipeline stages. With --overlap-grad-reduce the plain data-parallel means
(`dense_mean`) were reduced during backward already (`grad_overlap.py`); `reduce` skips them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from relax.backends.megatron.convert import is_expert
from relax.backends.megatron.vision import TOWER_PREFIXES

if TYPE_CHECKING:
    from relax.backends.megatron.rank import MegatronRank


def tied_copy(r: MegatronRank) -> torch.nn.Parameter | None:
    """Under pipeline parallelism with tied embeddings, this stage's copy of the embedding
    (the first stage's input embedding, the last stage's output layer); None otherwise."""
    if r.pp_size == 1 or not r.arch.tied:
        return None
    if r.first_stage:
        return r.model.embedding.word_embeddings.weight
    return r.model.output_layer.weight if r.last_stage else None


def partial_over_tensor_group(r: MegatronRank, name: str, p: torch.nn.Parameter) -> bool:
    """A weight each tensor rank holds whole but sees part of the tokens or heads for: the norms
    under --sequence-parallel, the q/k norms (shared by heads split over the group)."""
    return (r.config.sequence_parallel and getattr(p, "sequence_parallel", False)) or \
        (r.tp_size > 1 and ("q_layernorm" in name or "k_layernorm" in name))


def dense_mean(r: MegatronRank, name: str, p: torch.nn.Parameter) -> bool:
    """The weight's gradient is a plain mean over the data-parallel (with context-parallel) group:
    what --overlap-grad-reduce may reduce during backward (`grad_overlap.py`). Not an expert, a
    tied embedding across stages, a partial norm, or an encoder (one rank's rows may not reach it)."""
    return not (is_expert(name) or p is tied_copy(r) or partial_over_tensor_group(r, name, p)
                or name.startswith(TOWER_PREFIXES))


def reduce(r: MegatronRank, skip: set[int] = frozenset()) -> None:
    """Average gradients over the data-parallel ranks (see the module doc); `skip`: the ids of
    gradient holders --overlap-grad-reduce averaged already."""
    ps = r.ps
    dp_group = ps.get_data_parallel_group(with_context_parallel=True)
    align_missing(r, dp_group)
    tied = tied_copy(r)
    for name, p, grad in r.grads():
        if id(r.main.get(name, p)) in skip:
            continue
        if p is tied:  # first and last stage hold the tied embedding
            dist.all_reduce(grad, group=ps.get_embedding_group())
        if partial_over_tensor_group(r, name, p):
            dist.all_reduce(grad, group=ps.get_tensor_model_parallel_group())
        if is_expert(name):  # its expert-data-parallel copies (data and, under TP, tensor ranks) saw other tokens
            if ps.get_expert_data_parallel_world_size() > 1:
                dist.all_reduce(grad, group=ps.get_expert_data_parallel_group())
        elif r.dp_size * r.cp_size > 1:
            dist.all_reduce(grad, group=dp_group)
        if r.dp_size > 1:
            grad.div_(r.dp_size)


def align_missing(r: MegatronRank, dp_group: Any) -> None:
    """A weight this rank's micro-batches never reached (an encoder, when none of its rows had
    that kind of media) has no gradient while a data-parallel peer's has one: it gets zeros,
    so every rank makes the same all-reduces. Weights no rank reached keep none (the optimizer
    skips them, as it does on one rank)."""
    ps = r.ps
    trainable = [(name, r.main.get(name, p)) for name, p in r.model.named_parameters() if p.requires_grad]
    for experts, group, size in ((False, dp_group, r.dp_size * r.cp_size),
                                 (True, ps.get_expert_data_parallel_group(check_initialized=False),
                                  ps.get_expert_data_parallel_world_size())):
        params = [t for name, t in trainable if is_expert(name) == experts]
        if not params or size <= 1:
            continue
        has = torch.tensor([t.grad is not None for t in params], dtype=torch.int32, device=r.device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX, group=group)
        for t, h in zip(params, has.tolist()):
            if h and t.grad is None:
                t.grad = torch.zeros_like(t)


def clip_norm(r: MegatronRank, clip: float) -> float:
    """The norm of the whole model's gradient, each weight counted once: tensor-parallel shards
    summed over the tensor group, replicated weights from tensor rank 0 only, expert shards summed
    over the expert tensor x expert group (which holds each expert shard once; after `reduce` every
    copy of a shard holds the same gradient); scaled down to `clip` when larger (0: no clipping)."""
    ps = r.ps
    dense = torch.zeros((), dtype=torch.float64, device=r.device)
    expert = torch.zeros((), dtype=torch.float64, device=r.device)
    grads = []
    tied = tied_copy(r)
    for name, p, grad in r.grads():
        grads.append(grad)
        if tied is p and not r.first_stage:
            continue  # counted once, on the first stage
        sq = grad.double().pow(2).sum()
        sharded = getattr(p, "tensor_model_parallel", False)
        if is_expert(name):
            expert += sq
        elif sharded or r.tp_rank == 0:
            dense += sq
    if r.tp_size > 1:
        dist.all_reduce(dense, group=ps.get_tensor_model_parallel_group())
    if r.expert_group is not None:
        dist.all_reduce(expert, group=r.expert_group)
    total = dense + expert
    if r.pp_size > 1:
        dist.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
    norm = float(total.sqrt())
    if clip > 0 and norm == norm:
        coef = clip / (norm + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm
