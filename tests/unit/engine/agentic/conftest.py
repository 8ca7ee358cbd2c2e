"""One tiny text model and one in-process `hf` engine (true on-policy numerics: float32, the fsdp
target) shared by the agentic tests, and an in-process fsdp trainer for a module that asks
(module-scoped: a process holds one default process group at a time). agentic_helpers.py."""

from __future__ import annotations

import pytest
import torch
from agentic_helpers import TEMPERATURE, EngineServer, text_model


@pytest.fixture(scope="module")
def one_thread():
    """Engine and trainer run in this process: one torch thread, as --engine-threads 1 gives both."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def text_model_dir(tmp_path_factory) -> str:
    return text_model(str(tmp_path_factory.mktemp("agentic") / "model"))


@pytest.fixture(scope="session")
def engine(text_model_dir):
    server = EngineServer(text_model_dir, rl_on_policy_target="fsdp", dtype="float32")
    yield server
    server.close()


@pytest.fixture(scope="module")
def trainer(text_model_dir, one_thread):
    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig
    from relax.utils.net import free_port

    spec = TrainerSpec(model_path=text_model_dir, optim=OptimizerConfig(lr=1e-3),
                       batch=BatchConfig(micro_batch_size=4), loss=PolicyLossConfig(), temperature=TEMPERATURE,
                       threads=1, true_on_policy=True)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    yield worker
    worker.shutdown()


@pytest.fixture(autouse=True)
def _fresh_env_records():
    import agentic_envs

    agentic_envs.CLOSED.clear()
    agentic_envs.STEPS.clear()
    agentic_envs.HOOKS.clear()
    agentic_envs.EVALUATION.clear()
    agentic_envs.RELEASE.clear()
    yield
    agentic_envs.RELEASE.set()  # a test that failed midway never leaves a step blocked
