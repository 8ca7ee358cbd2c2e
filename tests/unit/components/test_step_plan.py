"""How a step's rows go to the data-parallel ranks (`relax.components.training.step_plan`), and
`--balance-data`, which the Actor passes to it (`balance_lengths`): the same rows in each
optimizer step, equal counts per rank, and even token counts across the ranks."""

from __future__ import annotations

from relax.components.training import balance_lengths, step_plan
from relax.config import parse_config
from relax.types import TrainBatch

# 2 optimizer steps of 8 rows; within each step the long rows come first
LENGTHS = [900, 800, 700, 600, 10, 20, 30, 40] * 2
MASKS = [[1] * n for n in LENGTHS]


def rank_tokens(shards: list[list[int]]) -> list[int]:
    return [sum(LENGTHS[i] for i in idx) for idx in shards]


def test_without_balancing_ranks_take_contiguous_rows():
    steps, shards, tokens = step_plan(MASKS, 8, 2)
    assert steps == 2 and shards == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    assert rank_tokens(shards) == [6000, 200] and tokens == [3100, 3100]


def test_balance_data_evens_the_ranks_tokens_and_keeps_each_step_s_rows():
    steps, shards, tokens = step_plan(MASKS, 8, 2, seq_lens=LENGTHS)
    assert steps == 2 and tokens == [3100, 3100]
    assert max(rank_tokens(shards)) - min(rank_tokens(shards)) <= 20
    assert [len(s) for s in shards] == [8, 8]
    for rank in shards:  # 4 rows of step 0, then 4 of step 1: groups do not move between steps
        assert all(i < 8 for i in rank[:4]) and all(i >= 8 for i in rank[4:])


def test_the_flag_reaches_the_plan_through_balance_lengths(base):
    batch = TrainBatch(tokens_RL=[[1] * n for n in LENGTHS], response_lengths_R=LENGTHS, loss_masks_RT=MASKS,
                       rewards_R=[0.0] * len(LENGTHS))
    assert balance_lengths(parse_config(base), batch) is None
    assert balance_lengths(parse_config(base + ["--balance-data"]), batch) == LENGTHS


def test_the_dry_run_says_the_rows_are_balanced(base):
    from relax.config.plan import format_plan, resolve_plan

    cfg = parse_config(base + ["--balance-data"])
    assert "each step's rows balanced by tokens over the ranks" in format_plan(resolve_plan(cfg), cfg)
