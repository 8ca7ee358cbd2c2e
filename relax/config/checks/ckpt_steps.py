"""--ref-ckpt-step and --opd-teacher-ckpt-step: a frozen model (the Reference, the OPD teacher)
taken from one step of a Relax run's checkpoints rather than from an HF directory.

The load flag (--ref-load, --opd-teacher-load) then names a checkpoint directory (`iter_XXXXXXX`
subdirectories, as --save writes) and the step must be a complete one there
(`relax.utils.checkpoints.step_checkpoint`). The model is built from --hf-checkpoint and the
step's weights are loaded over it, so the checkpoint must come from a run of that model. A teacher
engine (--opd-type sglang) loads HF models only, and a LoRA run's reference is its base model.
"""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig
from relax.utils.checkpoints import CheckpointError, step_checkpoint


def check_ckpt_steps(cfg: RelaxConfig) -> None:
    c, a = cfg.ckpt, cfg.algo
    if c.ref_ckpt_step is not None:
        if not c.ref_load:
            raise ConfigError(f"--ref-ckpt-step {c.ref_ckpt_step} picks a step of the checkpoint directory "
                              "--ref-load names: add --ref-load DIR")
        if cfg.lora.lora_rank:
            raise ConfigError("--ref-ckpt-step: a --lora-rank run's reference is its base model (--hf-checkpoint, "
                              "or --ref-load as an HF directory); drop --ref-ckpt-step")
        _check_step(c.ref_load, c.ref_ckpt_step, "--ref-load", "--ref-ckpt-step")
    if a.opd_teacher_ckpt_step is not None:
        if not a.opd_teacher_load:
            raise ConfigError(f"--opd-teacher-ckpt-step {a.opd_teacher_ckpt_step} picks a step of the checkpoint "
                              "directory --opd-teacher-load names: add --use-opd --opd-type megatron "
                              "--opd-teacher-load DIR")
        if a.opd_type != "megatron":
            raise ConfigError("--opd-teacher-ckpt-step: a teacher engine (--opd-type sglang) loads HF models only; "
                              "use --opd-type megatron (the teacher in the training backend) or point "
                              "--opd-teacher-load at an HF export of the run (--save-hf)")
        _check_step(a.opd_teacher_load, a.opd_teacher_ckpt_step, "--opd-teacher-load", "--opd-teacher-ckpt-step")


def _check_step(directory: str, step: int, flag: str, step_flag: str) -> None:
    try:
        step_checkpoint(directory, step, flag=flag, step_flag=step_flag)
    except CheckpointError as exc:
        raise ConfigError(str(exc)) from None
