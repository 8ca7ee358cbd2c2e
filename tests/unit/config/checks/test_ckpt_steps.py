"""--ref-ckpt-step and --opd-teacher-ckpt-step (`relax.config.checks.ckpt_steps`): the step must be a
complete one of the checkpoint directory its load flag names, checked before Ray starts."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config
from tests.checkpoint_dirs import checkpoint_dir


def test_ref_ckpt_step_takes_a_step_of_the_ref_load_directory(base, tmp_path):
    ckpt = checkpoint_dir(tmp_path / "ckpt", 3, 7)
    cfg = parse_config(base + ["--use-kl-loss", "--ref-load", ckpt, "--ref-ckpt-step", "3"])
    assert cfg.ckpt.ref_ckpt_step == 3 and cfg.ckpt.ref_load == ckpt


@pytest.mark.parametrize("extra, needle", [
    (["--ref-ckpt-step", "3"], "add --ref-load DIR"),
    (["--ref-load", "CKPT", "--ref-ckpt-step", "5"], "no checkpoint of step 5 (iter_0000005); the steps there: 3, 7"),
    (["--ref-load", "MODEL", "--ref-ckpt-step", "3"], "is an HF model directory; a step needs a checkpoint directory"),
    (["--ref-load", "CKPT", "--ref-ckpt-step", "3", "--lora-rank", "4"], "reference is its base model"),
])
def test_a_bad_ref_step_fails_before_ray_naming_the_step(base, tmp_path, extra, needle):
    ckpt = checkpoint_dir(tmp_path / "ckpt", 3, 7)
    model = base[base.index("--hf-checkpoint") + 1]
    args = [{"CKPT": ckpt, "MODEL": model}.get(a, a) for a in extra]
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--use-kl-loss"] + args)
    assert needle in str(err.value)


def test_opd_teacher_ckpt_step_loads_a_checkpoint_directory_in_the_training_backend(base, tmp_path):
    ckpt = checkpoint_dir(tmp_path / "teacher", 2)
    cfg = parse_config(base + ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", ckpt,
                               "--opd-teacher-ckpt-step", "2"])  # (no config.json there: a checkpoint directory)
    assert cfg.algo.opd_teacher_ckpt_step == 2


@pytest.mark.parametrize("extra, needle", [
    (["--opd-teacher-ckpt-step", "2"], "add --use-opd --opd-type megatron --opd-teacher-load DIR"),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-load", "CKPT", "--opd-teacher-ckpt-step", "2"],
     "a teacher engine (--opd-type sglang) loads HF models only"),
    (["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "CKPT", "--opd-teacher-ckpt-step", "4"],
     "--opd-teacher-ckpt-step 4: --opd-teacher-load"),
])
def test_a_bad_teacher_step_fails_naming_the_fix(base, tmp_path, extra, needle):
    ckpt = checkpoint_dir(tmp_path / "teacher", 2)
    with pytest.raises(ConfigError) as err:
        parse_config(base + [ckpt if a == "CKPT" else a for a in extra])
    assert needle in str(err.value)
