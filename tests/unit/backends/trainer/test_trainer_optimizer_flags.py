"""The optimizer-placement flags through a whole fsdp Trainer rank (in-process, world size 1, gloo):
`--optimizer-cpu-offload` with `--overlap-cpu-optimizer-d2h-h2d` and `--use-precision-aware-optimizer`
build the host optimizer over bfloat16-moment AdamW, the step's metrics say where the state is and
what the moments saved, the first step moves the model as plain AdamW does (bfloat16 moments only
round what the next step reads), and a checkpoint through DCP resumes exactly.
(The megatron backend's counterpart: tests/unit/backends/megatron/test_optimizer_flags.py.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.backends.trainer.host_optimizer import HostOptimizer
from relax.backends.trainer.lowp_adam import LowPrecisionAdamW
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.types import TrainBatch
from relax.utils.net import free_port

FLAGS = dict(optimizer_cpu_offload=True, overlap_cpu_optimizer_d2h_h2d=True, use_precision_aware_optimizer=True)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("m")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 pad_token_id=0)).save_pretrained(path)
    return str(path)


def trainer(path: str, **flags):
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(model_path=path, optim=OptimizerConfig(lr=1e-2, **flags), batch=BatchConfig(micro_batch_size=2),
                       loss=PolicyLossConfig(), threads=1, total_steps=4)
    return Trainer(0, 1, "127.0.0.1", free_port(), spec)


def batch() -> TrainBatch:
    lengths = [2, 2, 3]
    return TrainBatch(tokens_RL=[[1, 2, 3, 4, 5], [1, 2, 6, 7], [3, 4, 5, 6, 7, 8]], response_lengths_R=lengths,
                      loss_masks_RT=[[1] * n for n in lengths], advantages_RT=[[1.0] * 2, [-1.0] * 2, [0.5] * 3])


def step(w) -> tuple[dict[str, float], list[list[float]]]:
    b = batch()
    b.old_log_probs_RT = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
    metrics = w.train(b, 1, [7])
    return metrics, w.compute_log_probs(b.tokens_RL, b.response_lengths_R)


def test_offload_and_bf16_moments_train_as_adamw_and_report_their_memory(model_path):
    w = trainer(model_path)
    plain_metrics, plain_after = step(w)
    w.shutdown()
    w = trainer(model_path, **FLAGS)
    try:
        assert isinstance(w.optimizer, HostOptimizer)
        assert {type(c.inner) for c in w.optimizer.chunks} == {LowPrecisionAdamW}
        metrics, after = step(w)
        p = next(iter(w.optimizer.state))
        assert w.optimizer.state[p]["exp_avg"].dtype == torch.bfloat16
        assert w.optimizer.state[p]["exp_avg"].device.type == "cpu"
    finally:
        w.shutdown()
    assert "optimizer/state_device_gib" in plain_metrics and "optimizer/state_host_gib" not in plain_metrics
    numel = sum(t.numel() for t in w.runner.model.parameters())
    assert metrics["optimizer/state_host_gib"] * (1 << 30) == 2 * 2 * numel  # two bf16 moments per weight
    assert metrics["optimizer/moments_saved_gib"] == metrics["optimizer/state_host_gib"]  # half of float32's
    assert metrics["grad_norm"] == pytest.approx(plain_metrics["grad_norm"], rel=1e-6)
    for a, b in zip(after, plain_after):
        assert a == pytest.approx(b, abs=1e-5)


@pytest.mark.parametrize("bf16", [False, True], ids=["plain", "fsdp2"])
def test_an_offloaded_optimizer_resumes_exactly_from_a_dcp_checkpoint(model_path, tmp_path, bf16):
    """bf16: one rank FSDP2-wraps its model (bfloat16 compute over float32 DTensor shards): the host
    optimizer copies the local shards and shows DCP its state as DTensors of their layout."""
    w = trainer(model_path, bf16=bf16, **FLAGS)
    assert hasattr(w.optimizer.param_groups[0]["params"][0], "device_mesh") == bf16
    step(w)
    w.save(str(tmp_path / "ckpt"), 0)
    uninterrupted = [step(w)[1] for _ in range(2)]
    w.shutdown()
    w = trainer(model_path, bf16=bf16, **FLAGS)
    try:
        w.load(str(tmp_path / "ckpt"))
        resumed = [step(w)[1] for _ in range(2)]
    finally:
        w.shutdown()
    assert resumed == uninterrupted


def test_the_flags_reach_the_trainer_spec_from_the_command_line(base):
    from relax.components.training import make_trainer_group  # noqa: F401  (the spec takes cfg.optim whole)
    from relax.config import parse_config

    cfg = parse_config(base + ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                               "--use-precision-aware-optimizer"])
    assert {k: getattr(cfg.optim, k) for k in FLAGS} == FLAGS
    assert dataclasses.replace(TrainerSpec(model_path="x"), optim=cfg.optim).optim.optimizer_cpu_offload
