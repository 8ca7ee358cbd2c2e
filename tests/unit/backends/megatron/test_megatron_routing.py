"""Routing replay on megatron with expert parallelism over two ranks (float32, gloo, tests/rank_pool.py): R3
brings the per-token engine/trainer log-prob difference (hf engine in bfloat16, routing_cases.py)
to a dense model's level (a float32 forward of it) on megatron too, the training forward replays it
(first PPO ratio exactly 1) while the router learns, and R2 replays a recording forward's routing
bitwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing_cases  # noqa: E402

from relax.utils.net import free_port  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, rank_pool):
    root = str(tmp_path_factory.mktemp("r3-megatron"))
    paths = routing_cases.make_models(root)
    moe = routing_cases.engine_rows(paths["moe"], routed=True)
    port = free_port()
    job = rank_pool.submit(routing_cases.megatron_ranks, [(r, 2, port, paths["moe"], moe, f"{root}/out")
                                                          for r in range(2)], "the megatron EP=2 routing replay ranks")
    dense = routing_cases.engine_rows(paths["dense"], routed=False)  # meanwhile: the dense level
    level = routing_cases.mismatch(routing_cases.float32_log_probs(paths["dense"], dense), dense["logprobs"])
    rank_pool.wait(job, 600)
    return [json.load(open(f"{root}/out.{r}.json")) for r in range(2)], moe, level


def gather(results: list[dict], key: str, n: int) -> list:
    out = [None] * n
    for res in results:
        for i, values in zip(res["rows"], res[key]):
            out[i] = values
    return out


def test_r3_brings_the_mismatch_to_the_dense_level_under_expert_parallelism(ranks):
    results, moe, level = ranks
    assert [r["ep"] for r in results] == [2, 2]
    n = len(moe["tokens"])
    free = routing_cases.mismatch(gather(results, "free", n), moe["logprobs"])
    replayed = routing_cases.mismatch(gather(results, "replayed", n), moe["logprobs"])
    print(f"\nmegatron EP=2 |trainer - engine| log-prob (mean, max): dense {level}, MoE without R3 {free}, "
          f"with R3 {replayed}")
    assert replayed[0] <= 1.5 * level[0] and replayed[1] <= 2 * level[1]
    assert free[1] >= 5 * replayed[1] and free[0] >= 1.5 * replayed[0]


def test_training_replays_r3_the_router_learns_and_r2_replays_bitwise(ranks):
    results, _, _ = ranks
    for res in results:
        assert res["ppo_kl"] == 0.0 and res["router_moved"]
        assert res["again"] == res["free"]  # R2: the second forward replayed the first's routing
