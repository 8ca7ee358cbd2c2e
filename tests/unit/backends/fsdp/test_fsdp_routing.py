"""Routing replay on the fsdp trainer (float32) against the hf engine in bfloat16 (routing_cases.py):
R3 brings the first step's per-token engine/trainer log-prob difference to a dense model's level,
the training forward replays the same routing (the first PPO ratio exactly 1) and the router still
learns; R2 replays in the training pass what the old log-prob forward recorded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import routing_cases  # noqa: E402

from relax.algorithms.policy_loss import PolicyLossConfig  # noqa: E402
from relax.backends.base import TrainerSpec  # noqa: E402
from relax.config.schema import BatchConfig, OptimizerConfig  # noqa: E402
from relax.types import TrainBatch  # noqa: E402
from relax.utils.net import free_port  # noqa: E402


def trainer(model_dir: str, **spec):
    from relax.backends.trainer.trainer import Trainer

    return Trainer(0, 1, "127.0.0.1", free_port(), TrainerSpec(
        model_path=model_dir, optim=OptimizerConfig(lr=1e-2), batch=BatchConfig(micro_batch_size=8),
        loss=PolicyLossConfig(), threads=1, **spec))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The models, the engine's rows, the dense level (a float32 forward of the dense model)."""
    paths = routing_cases.make_models(str(tmp_path_factory.mktemp("r3")))
    dense = routing_cases.engine_rows(paths["dense"], routed=False)
    level = routing_cases.mismatch(routing_cases.float32_log_probs(paths["dense"], dense), dense["logprobs"])
    worker = trainer(paths["moe"], routing_replay=True)
    yield worker, routing_cases.engine_rows(paths["moe"], routed=True), level
    worker.shutdown()


def batch_of(rows: dict, old: list[list[float]], routing: bool) -> TrainBatch:
    lengths = rows["lengths"]
    return TrainBatch(tokens_RL=rows["tokens"], response_lengths_R=lengths, loss_masks_RT=[[1] * n for n in lengths],
                      advantages_RT=[[(-1.0) ** i] * n for i, n in enumerate(lengths)], old_log_probs_RT=old,
                      rollout_log_probs_RT=rows["logprobs"],
                      rollout_routed_experts_RB=rows["routing"] if routing else None)


def test_r3_brings_the_first_step_mismatch_to_a_dense_models_level(setup):
    worker, rows, dense = setup
    free = routing_cases.mismatch(worker.compute_log_probs(rows["tokens"], rows["lengths"]), rows["logprobs"])
    replayed = routing_cases.mismatch(
        worker.compute_log_probs(rows["tokens"], rows["lengths"], routing=rows["routing"]), rows["logprobs"])
    worker.forget_routing()
    print(f"\nfsdp |trainer - engine| log-prob (mean, max): dense {dense}, MoE without R3 {free}, with R3 {replayed}")
    assert replayed[0] <= 1.5 * dense[0] and replayed[1] <= 2 * dense[1]  # a dense model's level
    assert free[1] >= 5 * replayed[1] and free[0] >= 1.5 * replayed[0]  # routing flips without R3


def test_the_training_forward_replays_r3_and_the_router_still_learns(setup):
    worker, rows, _ = setup
    old = worker.compute_log_probs(rows["tokens"], rows["lengths"], routing=rows["routing"])
    gate = worker.runner.model.model.layers[0].mlp.gate.weight
    before = gate.detach().clone()
    metrics = worker.train(batch_of(rows, old, routing=True), 1, [sum(rows["lengths"])])
    assert metrics["ppo_kl"] == 0.0 and metrics["pg_clipfrac"] == 0.0  # the same routing as the old log-probs
    assert metrics["train_rollout_logprob_abs_diff_max"] < 0.1
    assert not torch.equal(before, gate.detach())  # gradients reach the router through the gate weights
    assert worker.forget_routing() == 0  # R3 rows record nothing


def test_r2_the_training_pass_replays_what_the_old_log_prob_forward_recorded(setup):
    worker, rows, _ = setup
    old = worker.compute_log_probs(rows["tokens"], rows["lengths"])  # records (the policy's first forward)
    assert len(worker.routes.kept) == len(rows["tokens"])
    metrics = worker.train(batch_of(rows, old, routing=False), 1, [sum(rows["lengths"])])
    assert metrics["ppo_kl"] == 0.0
    assert worker.forget_routing() == len(rows["tokens"]) and not worker.routes.kept
