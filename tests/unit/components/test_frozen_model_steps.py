"""A frozen model from a step of a Relax run's checkpoints: the Reference (`--ref-load` with
`--ref-ckpt-step`) and the OPD teacher on the training backend (`--opd-teacher-load` with
`--opd-teacher-ckpt-step`) are built from --hf-checkpoint's model and load that step's weights;
without a step they load the HF directory the flag names, as before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from relax.components import actor_fwd, teacher
from relax.components.training import initial_model
from relax.config.plan import RolePlan
from relax.config.schema import RelaxConfig
from relax.utils.checkpoints import CheckpointError
from tests.checkpoint_dirs import checkpoint_dir


class FakeGroup:
    """What the roles ask of their ranks here: the model they were built from, the weights loaded."""

    def __init__(self, model_path: str) -> None:
        self.model_path, self.loaded = model_path, []
        self.spec = SimpleNamespace(keep_weights=0)  # (what else a role reads of its ranks' spec)

    async def ready(self) -> None:
        pass

    async def load_weights(self, path: str) -> None:
        self.loaded.append(path)


@pytest.fixture
def groups(monkeypatch):
    built: list[FakeGroup] = []

    def make(cfg, plan, model_path, **kwargs):
        built.append(FakeGroup(model_path))
        return built[-1]

    monkeypatch.setattr(actor_fwd, "make_trainer_group", make)
    monkeypatch.setattr(teacher, "make_trainer_group", make)
    return built


def start_reference(cfg: RelaxConfig) -> None:
    role = actor_fwd.ActorFwd(cfg, RolePlan("reference", 1, "rank", writes=("ref_log_probs",)))
    asyncio.run(role.start())


def test_the_reference_loads_the_named_step_over_the_hf_model(groups, tmp_path):
    ckpt = checkpoint_dir(tmp_path / "ckpt", 2, 5)
    cfg = RelaxConfig().replace(hf_checkpoint="/hf", ref_load=ckpt, ref_ckpt_step=2)
    start_reference(cfg)
    assert groups[0].model_path == "/hf" and groups[0].loaded == [str(tmp_path / "ckpt" / "iter_0000002")]
    assert initial_model(cfg) == "/hf"  # the Actor starts from --hf-checkpoint, not the checkpoint directory


def test_without_a_step_the_reference_is_the_ref_load_hf_model(groups):
    cfg = RelaxConfig().replace(hf_checkpoint="/hf", ref_load="/ref-hf")
    start_reference(cfg)
    assert groups[0].model_path == "/ref-hf" and groups[0].loaded == []
    assert initial_model(cfg) == "/ref-hf"


def test_a_reference_step_gone_since_the_check_names_the_steps_there(groups, tmp_path):
    cfg = RelaxConfig().replace(hf_checkpoint="/hf", ref_load=checkpoint_dir(tmp_path / "ckpt", 5), ref_ckpt_step=2)
    with pytest.raises(CheckpointError, match="no checkpoint of step 2 .*the steps there: 5"):
        start_reference(cfg)


def test_the_worker_teacher_loads_the_named_step(groups, tmp_path):
    ckpt = checkpoint_dir(tmp_path / "teacher", 1, 4)
    cfg = RelaxConfig().replace(hf_checkpoint="/hf", use_opd=True, opd_type="megatron", opd_teacher_load=ckpt,
                                opd_teacher_ckpt_step=4)
    scorer = teacher.WorkerTeacher(cfg, RolePlan("teacher", 1, "rank"))
    asyncio.run(scorer.wait_ready())
    assert groups[0].model_path == "/hf" and groups[0].loaded == [str(tmp_path / "teacher" / "iter_0000004")]


def test_without_a_step_the_teacher_is_the_hf_model_it_names(groups):
    cfg = RelaxConfig().replace(hf_checkpoint="/hf", use_opd=True, opd_type="megatron", opd_teacher_load="/big")
    asyncio.run(teacher.WorkerTeacher(cfg, RolePlan("teacher", 1, "rank")).wait_ready())
    assert groups[0].model_path == "/big" and groups[0].loaded == []
