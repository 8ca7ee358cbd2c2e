"""Routing replay flags (relax.config.checks.routing) and their place in the run plan: they act on
an MoE checkpoint (R3 implies --use-routing-replay, and its column flows from the Rollout to every
forward of the policy's model), and are refused where they cannot act, naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relax.config import ConfigError, parse_config
from relax.config.plan import format_plan, resolve_plan

MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_experts": 8,
       "num_experts_per_tok": 2}


@pytest.fixture()
def moe(base) -> list[str]:
    """`base` on an MoE checkpoint's config."""
    (Path(base[1]) / "config.json").write_text(json.dumps(MOE))
    return base


def test_r3_implies_routing_replay_and_its_column_reaches_every_forward_of_the_policy(moe):
    cfg = parse_config(moe + ["--use-rollout-routing-replay", "--use-kl-loss", "--resource",
                              '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}'])
    assert cfg.algo.use_routing_replay
    plan = resolve_plan(cfg)
    flow = next(f for f in plan.columns if f.name == "rollout_routed_experts")
    assert flow.producer == "rollout" and set(flow.consumers) == {"actor", "reference"}
    text = format_plan(plan, cfg)
    assert "rollout_routed_experts  uint8    RB     rollout     actor, reference" in text
    assert "routing replay: R3" in text
    fully_async = resolve_plan(parse_config(moe + ["--use-rollout-routing-replay", "--fully-async"]))
    assert "actor_fwd" in next(f for f in fully_async.columns if f.name == "rollout_routed_experts").consumers


def test_routing_replay_alone_records_and_writes_no_column(moe):
    plan = resolve_plan(parse_config(moe + ["--use-routing-replay"]))
    assert all(f.name != "rollout_routed_experts" for f in plan.columns)
    assert "routing replay: the first forward" in format_plan(plan, parse_config(moe + ["--use-routing-replay"]))


@pytest.mark.parametrize("flag", ["--use-rollout-routing-replay", "--use-routing-replay"])
def test_a_dense_model_is_refused(base, flag):
    with pytest.raises(ConfigError, match=f"{flag}: .* is a dense model"):
        parse_config(base + [flag])


@pytest.mark.parametrize("config, extra, needle", [
    (dict(MOE, model_type="deepseek_v3"), [], "not of the softmax top-k kind"),
    (MOE, ["--true-on-policy-mode", "--rollout-backend", "hf", "--train-backend", "fsdp"],
     "with --true-on-policy-mode"),
    (MOE, ["--agent-function-path", "tests.unit.engine.agentic.agentic_agents.scripted"], "--agent-function-path"),
])
def test_what_r3_cannot_act_on_is_refused(base, config, extra, needle):
    (Path(base[1]) / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + ["--use-rollout-routing-replay"] + extra)


def test_recorded_replay_on_megatron_with_split_rows_is_refused(moe):
    pytest.importorskip("megatron.core")
    with pytest.raises(ConfigError, match="--use-routing-replay on megatron with --tensor-model-parallel-size 2"):
        parse_config(moe + ["--use-routing-replay", "--train-backend", "megatron", "--tensor-model-parallel-size",
                            "2", "--sequence-parallel", "--resource", '{"actor": [1, 2], "rollout": [1, 1]}'])


def test_r3_under_a_megatron_pipeline_with_full_recomputation_is_refused(moe):
    pytest.importorskip("megatron.core")
    with pytest.raises(ConfigError, match="--pipeline-model-parallel-size 2 and --recompute-granularity full"):
        parse_config(moe + ["--use-rollout-routing-replay", "--train-backend", "megatron",
                            "--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                            "--resource", '{"actor": [1, 2], "rollout": [1, 1]}'])
