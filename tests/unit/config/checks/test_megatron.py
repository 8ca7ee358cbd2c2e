"""The Megatron flags (`relax.config.checks.megatron`): model flags agree with the checkpoint,
and with --train-backend megatron each Megatron flag acts or is an error."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config
from relax.config.checks.flags import ignored_flag_notes


@pytest.mark.parametrize("extra, needle", [
    (["--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
     "--context-parallel-size 2 with --pipeline-model-parallel-size 2"),
    (["--advantage-estimator", "ppo", "--pipeline-model-parallel-size", "2"], "the critic (PPO) does not run with"),
    (["--expert-tensor-parallel-size", "2"], "--expert-tensor-parallel-size 2: the megatron backend does not build"),
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
