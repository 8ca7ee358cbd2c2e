"""relax.components.training: the run's flags as the training ranks receive them (the policy
loss's settings, the ranks' environment, their collectives), each shown by what it changes."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossInputs, compute_policy_loss
from relax.backends.trainer.trainer import collectives
from relax.components.training import make_trainer_group, policy_loss_config
from relax.config.plan import RolePlan
from relax.config.schema import RelaxConfig
from relax.distributed.ray import actor_group

MASK_BT = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def policy_loss(cfg: RelaxConfig, advantages_BT: torch.Tensor, log_ratio_BT: torch.Tensor | None = None) -> float:
    """The policy loss of one batch of two samples (3 + 2 loss tokens) under `cfg`'s flags."""
    old_BT = torch.zeros(2, 3)
    logp_BT = old_BT + (log_ratio_BT if log_ratio_BT is not None else 0.0)
    batch = PolicyLossInputs(logp=logp_BT, old_logp=old_BT, advantages=advantages_BT, mask_BT=MASK_BT,
                             num_global_samples=2, num_global_tokens=5)
    return compute_policy_loss(batch, policy_loss_config(cfg)).loss.item()


def test_calculate_per_token_loss_divides_by_the_token_count_not_the_sample_count():
    # On-policy, PPO's per-token loss is -A: sample 0 is [-1, -1, -1], sample 1 is [-2, -2].
    advantages_BT = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    per_sample = policy_loss(RelaxConfig(), advantages_BT)
    per_token = policy_loss(RelaxConfig().replace(calculate_per_token_loss=True), advantages_BT)
    assert per_sample == pytest.approx((-1.0 + -2.0) / 2)  # mean of each sample, over 2 samples
    assert per_token == pytest.approx((-3.0 + -4.0) / 5)  # sum of the tokens, over 5 tokens


def sapo_token(tau: float, ratio: float, advantage: float) -> float:
    """SAPO's loss of one token (arXiv 2511.20347): -(4 / tau) sigmoid(tau (r - 1)) A."""
    return -(4.0 / tau) / (1.0 + math.exp(-tau * (ratio - 1.0))) * advantage


@pytest.mark.parametrize("tau_pos", [1.0, 3.0])
def test_sapo_tau_pos_sets_the_gate_of_positive_advantages_only(tau_pos):
    cfg = RelaxConfig().replace(advantage_estimator="sapo", sapo_tau_pos=tau_pos, calculate_per_token_loss=True)
    advantages_BT = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    log_ratio_BT = torch.full((2, 3), math.log(1.5))  # every token off-policy: r = 1.5
    expected = (3 * sapo_token(tau_pos, 1.5, 1.0) + 2 * sapo_token(1.05, 1.5, -1.0)) / 5  # --sapo-tau-neg 1.05
    assert policy_loss(cfg, advantages_BT, log_ratio_BT) == pytest.approx(expected, rel=1e-5)


class FakeRemote:
    """`ray.remote(Trainer)`: records the Ray options and the arguments each rank is started with."""

    def __init__(self) -> None:
        self.options_seen: list[dict] = []
        self.args_seen: list[tuple] = []

    def options(self, **options):
        self.options_seen.append(options)
        return self

    def remote(self, *args):
        self.args_seen.append(args)  # (rank, world_size, master_addr, master_port, spec)
        return object()


@pytest.mark.parametrize("env", [{}, {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": 3}])
def test_train_env_vars_reach_every_training_rank_environment(monkeypatch, env):
    remote = FakeRemote()
    monkeypatch.setattr(actor_group.ray, "remote", lambda cls: remote)
    cfg = RelaxConfig().replace(train_env_vars=env)
    make_trainer_group(cfg, RolePlan("actor", 2, "rank"), "/model")
    assert len(remote.options_seen) == 2
    for options in remote.options_seen:
        assert options["runtime_env"]["env_vars"] == {**{k: str(v) for k, v in env.items()},
                                                      "RELAX_WORKER_GROUP": "actor"}


def rank_collectives(monkeypatch, cfg: RelaxConfig, device: str) -> tuple[str, timedelta, str]:
    """The collectives a training rank of `cfg` sets up on `device` (`Trainer.__init__`)."""
    remote = FakeRemote()
    monkeypatch.setattr(actor_group.ray, "remote", lambda cls: remote)
    make_trainer_group(cfg, RolePlan("actor", 1, "rank"), "/model")
    (*_, spec), = remote.args_seen
    return collectives(spec, torch.device(device))


def test_distributed_and_checkpoint_engine_backends_and_timeout_reach_the_ranks_collectives(monkeypatch):
    default = RelaxConfig()
    assert rank_collectives(monkeypatch, default, "cuda") == ("nccl", timedelta(minutes=10), "nccl")
    cfg = default.replace(distributed_backend="gloo", checkpoint_engine_backend="gloo", distributed_timeout_minutes=3)
    assert rank_collectives(monkeypatch, cfg, "cuda") == ("gloo", timedelta(minutes=3), "gloo")
    # CPU ranks take gloo whatever the flags say (NCCL carries no CPU tensors); the timeout holds.
    assert rank_collectives(monkeypatch, default.replace(distributed_timeout_minutes=3), "cpu") == (
        "gloo", timedelta(minutes=3), "gloo")
