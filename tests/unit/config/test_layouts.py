"""`--ref-actor-config` with the seeds' keys, and each training role's layout checked in the plan
(`relax.config.layouts`): a role whose ranks do not split into its layout fails before Ray starts."""

from __future__ import annotations

import json
import time

import pytest

from relax.config import ConfigError, PlanError, parse_config
from relax.config.layouts import scorer_config
from relax.config.plan import resolve_plan

SEED_KEYS = {"tensor_model_parallel_size": 1, "max_tokens_per_gpu": 16384, "sequence_parallel": False,
             "only_load_weight": True}  # the verl guide's async launch script


def fully_async(base: list[str], *extra: str) -> list[str]:
    return base + ["--fully-async", "--use-kl-loss", "--ref-actor-config", json.dumps(SEED_KEYS), *extra]


def test_the_seeds_keys_parse_and_set_the_scorers_layout_and_budget(base):
    cfg = parse_config(fully_async(base, "--tensor-model-parallel-size", "2", "--sequence-parallel"))
    scorer = scorer_config(cfg)
    assert scorer.parallel.tensor_model_parallel_size == 1 and not scorer.parallel.sequence_parallel
    assert scorer.batch.use_dynamic_batch_size and scorer.batch.log_probs_max_tokens_per_gpu == 16384
    assert cfg.parallel.tensor_model_parallel_size == 2 and not cfg.batch.use_dynamic_batch_size  # the actor's own


def test_under_fsdp_the_layout_keys_are_noted_as_ignored(base):
    notes = resolve_plan(parse_config(fully_async(base))).notes
    assert any("--ref-actor-config tensor_model_parallel_size, sequence_parallel: the fsdp backend" in n
               for n in notes), notes
    assert any("only_load_weight" in n and "always load the weights only" in n for n in notes)


@pytest.mark.parametrize("value, needle", [
    ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size must be an integer >= 1, got 0"),
    ({"sequence_parallel": "no"}, "sequence_parallel must be true or false"),
    ({"tp": 1}, "unknown key(s) ['tp']; it takes threads, tensor_model_parallel_size"),
])
def test_bad_keys_and_values_name_the_key(base, value, needle):
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--ref-actor-config", json.dumps(value)])
    assert needle in str(err.value)


def test_a_one_rank_reference_under_tp_2_is_a_plan_error_before_ray(base):
    pytest.importorskip("megatron.core")
    args = base + ["--train-backend", "megatron", "--tensor-model-parallel-size", "2", "--use-kl-loss",
                   "--resource", '{"actor": [1, 2], "rollout": [1, 1], "reference": [1, 1]}']
    start = time.perf_counter()
    with pytest.raises(PlanError, match=r"reference: 1 rank\(s\) do not split into tensor x pipeline x context "
                                        r"parallel groups of 2 x 1 x 1.*--ref-actor-config"):
        resolve_plan(parse_config(args))
    assert time.perf_counter() - start < 5  # not the worker's ValueError ~100 s later
    ok = resolve_plan(parse_config(args + ["--ref-actor-config", '{"tensor_model_parallel_size": 1}']))
    assert ok.role("reference").workers == 1


def test_the_actor_s_layout_is_checked_too(base):
    pytest.importorskip("megatron.core")
    with pytest.raises(PlanError, match=r"actor: 1 rank\(s\) do not split .* 1 x 2 x 1"):
        resolve_plan(parse_config(base + ["--train-backend", "megatron", "--pipeline-model-parallel-size", "2"]))
