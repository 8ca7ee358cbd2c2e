"""Ranks whose forwards communicate run as many micro-batches, whatever rows each holds.

An FSDP forward all-gathers the sharded weights and an expert-parallel forward exchanges tokens,
so two data-parallel ranks must run the same number of micro-batches. Here they would not
without `TrainWorkerBase._micro_batches`' lockstep: with dynamic batching one rank's shard packs
into one micro-batch and its peer's into two, and a scoring pass gives one rank a single row and
the other three. Two real ranks over gloo (fsdp with DP=2; megatron with EP=2 on a MoE) must
finish and compute what one fsdp rank computes on all the rows: the log-probs of every scored
row, and one optimizer step's gradient norm and log-probs after it.
"""

from __future__ import annotations

import dataclasses

import importlib.util
import json

import pytest
import torch

from relax.utils.net import free_ports

BUDGET = 16  # padded tokens per micro-batch
# Training shards (one step over DP=2): rank 0 rows 0-3 fit one micro-batch of 4 x 4; rank 1's
# row 7 (12 tokens) needs a second. Scoring shards: rank 0 one row, rank 1 three rows that a
# budget of 4 tokens puts in three micro-batches (rank 0 runs two throwaway forwards).
LENGTHS = [4, 4, 4, 4, 4, 4, 4, 12]
TRAIN_SHARDS = [[0, 1, 2, 3], [4, 5, 6, 7]]
SCORE_SHARDS, SCORE_BUDGET = [[0], [1, 2, 3]], 4
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None


def rows():
    from relax.types import TrainBatch

    g = torch.Generator().manual_seed(5)
    tokens = [torch.randint(1, 64, (n,), generator=g).tolist() for n in LENGTHS]
    lengths = [2] * len(LENGTHS)
    adv = [[(-1.0) ** i * (0.25 + 0.1 * i)] * n for i, n in enumerate(lengths)]
    return TrainBatch(tokens_RL=tokens, response_lengths_R=lengths, loss_masks_RT=[[1] * n for n in lengths],
                      advantages_RT=adv)


def worker(backend: str, model: str, rank: int, world: int, port: int, parallel: dict, budget: int):
    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import ModelParallelSpec, TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig

    spec = TrainerSpec(model_path=model, optim=OptimizerConfig(lr=1e-2, clip_grad=1.0), threads=1,
                       batch=BatchConfig(micro_batch_size=8, use_dynamic_batch_size=True, max_tokens_per_gpu=budget,
                                         log_probs_max_tokens_per_gpu=SCORE_BUDGET),
                       loss=PolicyLossConfig(), model_parallel=ModelParallelSpec(**parallel))
    return Trainer(rank, world, "127.0.0.1", port, dataclasses.replace(spec, backend=backend))


def run_rank(rank: int, world: int, ports: list[int], cases: list, out: str) -> None:
    """Each case: score this rank's scoring shard, train one step on its training shard, score
    that shard again."""
    results = []
    for i, (backend, model, parallel) in enumerate(cases):
        w = worker(backend, model, rank, world, ports[i], parallel, BUDGET)
        b = rows()
        score = b.rows(SCORE_SHARDS[rank] if world > 1 else sum(SCORE_SHARDS, []))
        scored = w.compute_log_probs(score.tokens_RL, score.response_lengths_R)
        mine = b.rows(TRAIN_SHARDS[rank] if world > 1 else sum(TRAIN_SHARDS, []))
        mine.old_log_probs_RT = w.compute_log_probs(mine.tokens_RL, mine.response_lengths_R)
        tokens = [sum(map(sum, b.loss_masks_RT))]
        metrics = w.train(mine, 1, tokens)
        after = w.compute_log_probs(mine.tokens_RL, mine.response_lengths_R)
        w.shutdown()
        results.append({"scored": scored, "grad_norm": metrics["grad_norm"], "after": after})
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def results(tmp_path_factory, rank_pool):
    root = tmp_path_factory.mktemp("lockstep")
    from tests.unit.backends.megatron.parity_cases import make_models

    paths = make_models(str(root))
    cases = [("fsdp", paths["dense"], {})]
    if HAS_MEGATRON:
        cases.append(("megatron", paths["moe"], {"ep": 2}))
    reference = [("fsdp", paths["dense"], {}), ("fsdp", paths["moe"], {})][:len(cases)]
    port, port1 = free_ports(len(cases)), free_ports(len(reference))
    job = rank_pool.submit(run_rank, [(r, 2, port, cases, f"{root}/two") for r in range(2)], "the two-rank group")
    run_rank(0, 1, port1, reference, f"{root}/one")
    rank_pool.wait(job, 300)
    load = lambda name: json.load(open(f"{root}/{name}.json"))  # noqa: E731
    return [c[0] for c in cases], load("one.0"), [load("two.0"), load("two.1")]


def test_ranks_with_unequal_micro_batch_counts_compute_what_one_rank_does(results):
    names, one, (r0, r1) = results
    for i, name in enumerate(names):
        scored = r0[i]["scored"] + r1[i]["scored"]
        assert len(scored) == len(one[i]["scored"]) == 4, name
        for got, want in zip(scored, one[i]["scored"]):
            assert got == pytest.approx(want, abs=1e-5), name
        assert r0[i]["grad_norm"] == pytest.approx(one[i]["grad_norm"], abs=1e-4), name
        assert r1[i]["grad_norm"] == pytest.approx(one[i]["grad_norm"], abs=1e-4), name
        for got, want in zip(r0[i]["after"] + r1[i]["after"], one[i]["after"]):
            assert got == pytest.approx(want, abs=1e-4), name


def test_even_out_splits_the_largest_padded_micro_batch_and_pads_with_empty_ones():
    from relax.backends.batching import even_out, split_micro_batches

    first = split_micro_batches(LENGTHS[:4], micro_batch_size=1, max_tokens=BUDGET)
    second = split_micro_batches(LENGTHS[4:], micro_batch_size=1, max_tokens=BUDGET)
    assert (len(first), len(second)) == (1, 2)  # what the two training shards would run alone
    assert even_out(first, LENGTHS[:4], 2) == [[0, 1], [2, 3]]
    assert even_out([[0, 1, 2], [3]], [2, 2, 2, 9], 3) == [[0], [1, 2], [3]]  # 3 x 2 = 6 < 1 x 9: split the 3
    assert even_out([[0]], [4], 3) == [[0], [], []]
