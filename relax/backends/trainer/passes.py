"""A pass's micro-batches: the plan made from the rows' lengths, kept in step between ranks whose
forwards communicate, and the bookkeeping of a streamed training pass.

Micro-batches follow `--micro-batch-size`, or with `--use-dynamic-batch-size` the padded
token budget (`relax.backends.batching.split_micro_batches`). Where a forward is a collective
across ranks that hold different rows (FSDP's parameter all-gathers with several data-parallel
ranks, megatron's expert-parallel token exchange: the runner's `layout.lockstep`), every rank
of the group runs as many micro-batches as the busiest one: larger ones are split, and an empty
one stands for a throwaway forward (`runner_kit.THROWAWAY`). Without it a rank with fewer
micro-batches (dynamic batching, or a scoring shard with one row less) left its peers blocked
in an all-gather, or paired their collectives with its next pass's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from relax.backends.base import RankLayout, Rows
from relax.backends.batching import even_out, split_micro_batches
from relax.backends.trainer.runner_kit import THROWAWAY
from relax.config.schema import BatchConfig
from relax.types import TrainBatch
from relax.utils import memory_check


def micro_batches(lengths: list[int], batch: BatchConfig, max_tokens: int | None, layout: RankLayout,
                  device: torch.device) -> list[list[int]]:
    """This rank's micro-batches (row indices), as many as its lockstep peers run."""
    if max_tokens:
        max_tokens *= layout.token_scale
    micro = split_micro_batches(lengths, micro_batch_size=batch.micro_batch_size,
                                max_tokens=max_tokens if batch.use_dynamic_batch_size else None)
    if layout.lockstep is None:
        return micro
    count = torch.tensor([len(micro)], device=device)
    with memory_check.collective("micro-batch count agreement"):
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=layout.lockstep)
    return even_out(micro, lengths, int(count.item()))


def scoring_rows(idx: list[int], tokens: list[list[int]], lengths: list[int],
                 media: list[bytes] | None) -> Rows:
    """Micro-batch `idx` of a scoring pass; an empty one is the throwaway row."""
    if not idx:
        return THROWAWAY
    return Rows([tokens[i] for i in idx], [lengths[i] for i in idx],
                None if media is None else [media[i] for i in idx])


def plan_pass(lengths: list[int], num_steps: int, batch: BatchConfig, layout: RankLayout,
              device: torch.device) -> list[list[list[int]]]:
    """Per optimizer step, the micro-batches (shard row positions) of a training pass: each
    step's rows split evenly, in order."""
    per_step = len(lengths) // num_steps
    plan = []
    for s in range(num_steps):
        rows = list(range(s * per_step, (s + 1) * per_step))
        micro = micro_batches([lengths[i] for i in rows], batch, batch.max_tokens_per_gpu, layout, device)
        if not all(micro):
            raise RuntimeError(f"step {s}: this rank has {len(rows)} rows but its peers run {len(micro)} "
                               "micro-batches; training shards must hold as many rows on every rank "
                               "(relax.components.training.shard_rows)")
        plan.append([[rows[i] for i in idx] for idx in micro])
    return plan


@dataclasses.dataclass
class TrainPass:
    """One pass over a shard (`Trainer.train_begin`): the micro-batch plan per optimizer step
    (row positions), the rows arrived so far and where the pass stands."""

    plan: list[list[list[int]]]
    global_tokens: list[int]
    num_rows: int
    batch: TrainBatch | None = None
    arrived: set[int] = dataclasses.field(default_factory=set)
    step: int = 0
    micro: int = 0
    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    totals: dict[str, float] = dataclasses.field(default_factory=dict)

    def take(self, positions: list[int], rows: TrainBatch) -> None:
        if self.batch is None:
            self.batch = TrainBatch.empty(self.num_rows, rows.present())
        self.batch.put(positions, rows)
        self.arrived.update(positions)

    def ready(self, whole_step: bool) -> int:
        """How many micro-batches of the current step, from the next one on, have all their rows
        (with `whole_step`, all of the step's or none)."""
        if self.step >= len(self.plan):
            return 0
        micro = self.plan[self.step]
        n = 0
        while self.micro + n < len(micro) and all(i in self.arrived for i in micro[self.micro + n]):
            n += 1
        if whole_step and self.micro + n < len(micro):
            return 0
        return n

    def missing(self) -> int:
        return self.num_rows - len(self.arrived)


def reduce_metric(op: str, current: float | None, value: float) -> float:
    """Combine one metric across micro-batches/steps: sum (pre-normalised means), max or min."""
    if current is None:
        return value
    return {"max": max, "min": min}.get(op, lambda a, b: a + b)(current, value)


def add_micro_metrics(sums: dict[str, float], outputs: list[Any]) -> None:
    """A schedule's loss outputs into the step's sums (each metric by its own reduction)."""
    for out in outputs:
        for k, v in out.metrics.items():
            sums[k] = reduce_metric(out.reduce_ops.get(k, "sum"), sums.get(k), float(v))


def add_step_metrics(totals: dict[str, float], metrics: dict[str, float], num_steps: int) -> None:
    """An optimizer step's metrics into the pass's totals (means over steps; *_max/*_min kept)."""
    for k, v in metrics.items():
        op = "max" if k.endswith("_max") else "min" if k.endswith("_min") else "sum"
        totals[k] = reduce_metric(op, totals.get(k), v if op != "sum" else v / num_steps)
