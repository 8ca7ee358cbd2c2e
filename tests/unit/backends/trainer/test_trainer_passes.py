"""A training pass's plan and bookkeeping (relax.backends.trainer.passes): micro-batches per optimizer
step, which of them can run as rows arrive (one by one, or whole steps for a pipeline schedule), and the
throwaway row of an empty scoring micro-batch."""

from __future__ import annotations

import pytest
import torch

from relax.backends.base import RankLayout
from relax.backends.trainer import passes
from relax.backends.trainer.runner_kit import THROWAWAY
from relax.config.schema import BatchConfig
from relax.types import TrainBatch

CPU = torch.device("cpu")


def shard(positions: list[int]) -> TrainBatch:
    return TrainBatch(tokens_RL=[[p, p] for p in positions], response_lengths_R=[1] * len(positions),
                      loss_masks_RT=[[1]] * len(positions))


def test_each_step_splits_its_own_rows_into_micro_batches():
    plan = passes.plan_pass([4] * 6, 2, BatchConfig(micro_batch_size=2), RankLayout(), CPU)
    assert plan == [[[0, 1], [2]], [[3, 4], [5]]]


def test_dynamic_batching_budget_scales_with_the_ranks_one_micro_batch_spans():
    batch = BatchConfig(micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=8)
    assert passes.micro_batches([4, 4, 4, 4], batch, 8, RankLayout(), CPU) == [[0, 1], [2, 3]]
    assert passes.micro_batches([4, 4, 4, 4], batch, 8, RankLayout(token_scale=2), CPU) == [[0, 1, 2, 3]]


def test_micro_batches_run_as_their_rows_arrive_one_by_one_or_whole_steps():
    plan = [[[0, 1], [2, 3]], [[4, 5]]]
    p = passes.TrainPass(plan=plan, global_tokens=[4, 2], num_rows=6)
    p.take([2, 3], shard([2, 3]))
    assert p.ready(whole_step=False) == 0  # the step's first micro-batch is still missing rows
    p.take([0, 1], shard([0, 1]))
    assert p.ready(whole_step=False) == 2 and p.ready(whole_step=True) == 2
    p.micro = 1  # the first ran on its own
    assert p.ready(whole_step=False) == 1
    p.step, p.micro = 1, 0
    p.take([4], shard([4]))
    assert p.ready(whole_step=False) == 0 and p.missing() == 1
    p.take([5], shard([5]))
    assert p.ready(whole_step=True) == 1
    assert p.batch.tokens_RL == [[i, i] for i in range(6)]


def test_a_pipeline_schedule_waits_for_the_whole_step():
    p = passes.TrainPass(plan=[[[0], [1]]], global_tokens=[2], num_rows=2)
    p.take([0], shard([0]))
    assert p.ready(whole_step=False) == 1 and p.ready(whole_step=True) == 0


def test_an_empty_scoring_micro_batch_is_the_throwaway_row():
    assert passes.scoring_rows([], [[1, 2]], [1], None) is THROWAWAY
    rows = passes.scoring_rows([1], [[1, 2], [3, 4, 5]], [1, 2], [b"a", b"b"])
    assert (rows.tokens, rows.response_lengths, rows.media) == ([[3, 4, 5]], [2], [b"b"])


def test_step_metrics_average_over_steps_but_keep_extremes():
    totals: dict[str, float] = {}
    passes.add_step_metrics(totals, {"loss": 1.0, "ratio_max": 2.0}, 2)
    passes.add_step_metrics(totals, {"loss": 3.0, "ratio_max": 1.5}, 2)
    assert totals == {"loss": pytest.approx(2.0), "ratio_max": 2.0}
