"""The megatron backend under the seeds' optimizer flags (`--optimizer-cpu-offload
--overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer`), in-process on one rank (gloo):
the shared optimizer steps host copies of the float32 main weights (`--bf16`) with bfloat16 Adam
moments, the first step moves the model as plain AdamW does, and a per-rank checkpoint resumes
exactly. Data-parallel ranks (each offloading its ZeRO-1 shard) run in test_parity.py's dp2zero case."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("megatron.core")
sys.path.insert(0, os.path.dirname(__file__))
import parity_cases  # noqa: E402

from relax.algorithms.policy_loss import PolicyLossConfig  # noqa: E402
from relax.backends.base import TrainerSpec  # noqa: E402
from relax.config.schema import BatchConfig, OptimizerConfig  # noqa: E402
from relax.utils.net import free_port  # noqa: E402

FLAGS = dict(optimizer_cpu_offload=True, overlap_cpu_optimizer_d2h_h2d=True, use_precision_aware_optimizer=True)


def worker(path: str, **flags):
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(backend="megatron", model_path=path, optim=OptimizerConfig(lr=1e-2, bf16=True, **flags),
                       batch=BatchConfig(micro_batch_size=2), loss=PolicyLossConfig(), threads=1, total_steps=4)
    return Trainer(0, 1, "127.0.0.1", free_port(), spec)


def step(w):
    b = parity_cases.batch()
    b.old_log_probs_RT = w.compute_log_probs(b.tokens_RL, b.response_lengths_R)
    metrics = w.train(b, 1, [sum(map(sum, b.loss_masks_RT))])
    return metrics, w.compute_log_probs(b.tokens_RL, b.response_lengths_R)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return parity_cases.make_models(str(tmp_path_factory.mktemp("m")))["dense"]


def test_offloaded_bf16_moment_optimizer_steps_the_main_weights_on_the_host(path, tmp_path):
    import torch

    from relax.backends.trainer.host_optimizer import HostOptimizer

    w = worker(path)
    _, plain_after = step(w)
    w.shutdown()
    w = worker(path, **FLAGS)
    try:
        assert isinstance(w.optimizer, HostOptimizer)
        mains = {id(m) for m in w.runner.r.main.values()}
        assert {id(p) for c in w.optimizer.chunks for p in c.params} == mains  # the float32 main weights
        metrics, after = step(w)
        state = next(iter(w.optimizer.state.values()))
        assert state["exp_avg"].dtype == torch.bfloat16 and state["exp_avg"].device.type == "cpu"
        assert metrics["optimizer/moments_saved_gib"] > 0 and metrics["optimizer/state_host_gib"] > 0
        w.save(str(tmp_path / "ckpt"), 0)
        uninterrupted = [step(w)[1] for _ in range(2)]
    finally:
        w.shutdown()
    for a, b in zip(after, plain_after):
        # step 1's update is AdamW's (bf16 moments only round what step 2 reads); the weights are cast to bf16
        assert a == pytest.approx(b, abs=1e-3)
    w = worker(path, **FLAGS)
    try:
        w.load(str(tmp_path / "ckpt"))
        resumed = [step(w)[1] for _ in range(2)]
    finally:
        w.shutdown()
    assert resumed == uninterrupted
