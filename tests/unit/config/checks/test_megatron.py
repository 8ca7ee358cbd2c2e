"""The Megatron flags (`relax.config.checks.megatron`): model flags agree with the checkpoint,
and with --train-backend megatron each Megatron flag acts or is an error."""

from __future__ import annotations

import pytest

import json
from pathlib import Path

from relax.config import ConfigError, PlanError, parse_config
from relax.config.checks.flags import ignored_flag_notes
from relax.config.checks.megatron import conversion_family, megatron_notes, megatron_unfit, qkv_layout
from relax.config.plan import resolve_plan


@pytest.mark.parametrize("extra, needle", [
    (["--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
     "--context-parallel-size 2 with --pipeline-model-parallel-size 2"),
    (["--advantage-estimator", "ppo", "--pipeline-model-parallel-size", "2"], "the critic (PPO) does not run with"),
    (["--expert-tensor-parallel-size", "2"], "--expert-tensor-parallel-size 2 needs an MoE model"),
    (["--qkv-format", "bshd", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "64"],
     "--qkv-format bshd with --use-dynamic-batch-size: dynamic batching is not supported in bshd mode"),
    (["--qkv-format", "bshd", "--ref-actor-config", '{"max_tokens_per_gpu": 64}'],
     "--qkv-format bshd with --ref-actor-config max_tokens_per_gpu"),
    (["--model-name", "gpt2"], "--model-name gpt2: no Megatron<->HF conversion by that name; known: llama, mistral"),
    (["--megatron-to-hf-mode", "bridge"], "bridge conversion"),
    (["--attention-dropout", "0.1"], "RL training runs without dropout"),
    (["--num-layers", "4"], "--num-layers 4 contradicts"),
    (["--some-megatron-flag"], "--some-megatron-flag: not Relax flags"),
    (["--multimodal-keys", '{"image": "image"}'],
     "the megatron backend trains the vision-language models qwen2_5_vl, qwen3_vl"),
])
def test_megatron_backend_rejects_what_it_does_not_build(base, extra, needle):
    pytest.importorskip("megatron.core")
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--train-backend", "megatron"] + extra)
    assert needle in str(err.value)


def test_megatron_backend_acts_on_its_flags(base):
    pytest.importorskip("megatron.core")
    from relax.components.training import model_parallel_spec

    cfg = parse_config(base + ["--train-backend", "megatron", "--tensor-model-parallel-size", "2",
                               "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "1",
                               "--recompute-granularity", "selective"])
    assert cfg.cluster.train_backend == "megatron"
    assert ignored_flag_notes(cfg) == []  # each acts or is an error
    spec = model_parallel_spec(cfg)
    assert (spec.tp, spec.pp, spec.ep, spec.recompute_granularity) == (2, 2, 1, "selective")


def test_megatron_backend_runs_fully_async(base):
    pytest.importorskip("megatron.core")
    cfg = parse_config(base + ["--train-backend", "megatron", "--fully-async", "--max-staleness", "1"])
    assert cfg.cluster.fully_async and cfg.cluster.train_backend == "megatron"


def with_config(base: list[str], **config) -> list[str]:
    """`base` with its checkpoint's config.json replaced by `config`."""
    (Path(base[base.index("--hf-checkpoint") + 1]) / "config.json").write_text(json.dumps(config))
    return base


MOE = dict(model_type="qwen3_moe", num_hidden_layers=2, hidden_size=64, num_experts=4, moe_intermediate_size=16)


def test_qkv_format_thd_packs_where_built_and_the_plan_says_where_it_pads(base):
    """--qkv-format: thd (the default) reaches the ranks as packed rows; with pipeline or context
    parallelism, routing replay or a VL model they pad, and the plan says why; bshd pads, no note."""
    pytest.importorskip("megatron.core")
    from relax.components.training import model_parallel_spec

    megatron = base + ["--train-backend", "megatron"]
    cfg = parse_config(megatron)
    assert qkv_layout(cfg) == ("thd", "") and model_parallel_spec(cfg).qkv_format == "thd"
    assert not any("--qkv-format" in n for n in megatron_notes(cfg))
    cfg = parse_config(megatron + ["--pipeline-model-parallel-size", "2"])
    assert model_parallel_spec(cfg).qkv_format == "bshd"
    assert "--qkv-format thd: rows are right-padded (bshd) in this run: packed rows are not built with " \
           "--pipeline-model-parallel-size 2" in megatron_notes(cfg)
    cfg = parse_config(megatron + ["--qkv-format", "bshd"])
    assert model_parallel_spec(cfg).qkv_format == "bshd" and megatron_notes(cfg) == []
    assert ignored_flag_notes(parse_config(base + ["--qkv-format", "bshd"]))  # fsdp: noted as ignored
    vl = parse_config(with_config(megatron, model_type="qwen2_5_vl", num_hidden_layers=2, hidden_size=64))
    assert qkv_layout(vl) == ("bshd", "a vision-language model")


def test_expert_tensor_parallel_size_reaches_the_ranks_and_must_split_the_experts(base):
    pytest.importorskip("megatron.core")
    from relax.components.training import model_parallel_spec

    megatron = with_config(base, **MOE) + ["--train-backend", "megatron"]
    assert model_parallel_spec(parse_config(megatron + ["--expert-tensor-parallel-size", "2"])).etp == 2
    with pytest.raises(ConfigError, match="--expert-tensor-parallel-size 3 does not split the experts' FFN "
                                          r"\(moe_intermediate_size 16\)"):
        parse_config(megatron + ["--expert-tensor-parallel-size", "3"])
    zero = megatron + ["--expert-tensor-parallel-size", "2", "--use-distributed-optimizer"]
    notes = megatron_notes(parse_config(zero))  # ETP over data-parallel ranks: their experts differ
    assert any(n.startswith("--use-distributed-optimizer: the data-parallel ranks hold different experts")
               for n in notes)
    assert not megatron_notes(parse_config(zero + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]))
    with pytest.raises(PlanError, match=r"actor: 2 rank\(s\) do not split into expert tensor x expert parallel "
                                        r"groups of 4 x 1"):
        resolve_plan(parse_config(megatron + ["--expert-tensor-parallel-size", "4", "--resource",
                                              '{"actor": [1, 2], "rollout": [1, 1]}']))


def test_model_name_picks_the_converter_and_an_unknown_model_type_asks_for_it(base):
    """--model-name reaches the ranks; a checkpoint whose model_type has no converter is unfit for
    megatron (auto picks fsdp; explicit megatron names --model-name) unless --model-name names one."""
    pytest.importorskip("megatron.core")
    from relax.components.training import model_parallel_spec

    megatron = with_config(base, model_type="my_qwen3", num_hidden_layers=2, hidden_size=64) + \
        ["--train-backend", "megatron"]
    with pytest.raises(ConfigError, match="model_type my_qwen3: the megatron backend converts llama, .*set "
                                          "--model-name"):
        parse_config(megatron)
    cfg = parse_config(megatron + ["--model-name", "qwen3"])
    assert model_parallel_spec(cfg).model_name == "qwen3" and ignored_flag_notes(cfg) == []
    assert megatron_unfit(cfg) == [] and conversion_family("qwen3") == "qwen3"


def test_megatron_model_flags_reach_the_ranks_or_say_why_not(base):
    """--allgather-cp, --recompute-loss-function and --custom-model-provider-path reach the ranks' spec;
    --allgather-cp without context parallelism and --recompute-loss-function on one tensor rank (the
    chunked head recomputes anyway) get plan notes; a model provider is megatron's only."""
    pytest.importorskip("megatron.core")
    from relax.components.training import model_parallel_spec

    megatron = base + ["--train-backend", "megatron", "--recompute-loss-function", "--allgather-cp"]
    cfg = parse_config(megatron + ["--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--resource",
                                   '{"actor": [1, 4], "rollout": [1, 1]}'])
    spec = model_parallel_spec(cfg)
    assert spec.allgather_cp and spec.recompute_loss_function
    assert not [n for n in resolve_plan(cfg).notes if "-cp" in n or "recompute" in n]
    notes = resolve_plan(parse_config(megatron)).notes
    assert any("--allgather-cp: no effect in this run; acts only with --context-parallel-size > 1" in n for n in notes)
    assert any(n.startswith("--recompute-loss-function: with one tensor-parallel rank") for n in notes)
    with pytest.raises(ConfigError, match="--custom-model-provider-path builds a megatron-core model"):
        parse_config(base + ["--train-backend", "fsdp", "--custom-model-provider-path", "json.dumps"])
    with pytest.raises(ConfigError, match="--custom-model-provider-path: .*cannot be called as model_provider"):
        parse_config(base + ["--train-backend", "megatron", "--custom-model-provider-path", "json.dumps"])


def test_attention_backend_flash_runs_sdpa_and_the_unbuilt_backends_are_errors(base):
    """The verl guide's `--attention-backend flash` starts a megatron run with a plan note (its SDPA
    attention takes the flash kernel where it applies); fused/unfused/local name what this build runs;
    a value outside megatron-core's choices fails at parse time."""
    pytest.importorskip("megatron.core")
    megatron = base + ["--train-backend", "megatron"]
    notes = resolve_plan(parse_config(megatron + ["--attention-backend", "flash"])).notes
    assert any(n.startswith("--attention-backend flash: attention is PyTorch SDPA") for n in notes)
    assert not [n for n in resolve_plan(parse_config(megatron + ["--attention-backend", "auto"])).notes
                if "attention-backend" in n]
    for value in ("fused", "unfused", "local"):
        with pytest.raises(ConfigError, match=f"--attention-backend {value}: the megatron backend runs auto or flash"):
            parse_config(megatron + ["--attention-backend", value])
    with pytest.raises(SystemExit):  # argparse: invalid choice 'flashy' (choose from flash, fused, ...)
        parse_config(megatron + ["--attention-backend", "flashy"])
    fsdp = resolve_plan(parse_config(base + ["--train-backend", "fsdp", "--attention-backend", "flash"])).notes
    assert any("--attention-backend" in n and "fsdp backend ignores it" in n for n in fsdp)
