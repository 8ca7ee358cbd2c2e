"""The algorithm's flags and the roles they deploy: the KL reference, the critic (PPO), the OPD
teacher and the GenRM judge.

A flag that configures a role the run does not deploy fails naming the flag that would deploy
it (a `--critic-lr` without `--advantage-estimator ppo` would silently do nothing).
"""

from __future__ import annotations

from pathlib import Path

from relax.config.errors import ConfigError
from relax.config.fields import flag_for
from relax.config.roles import Role
from relax.config.schema import GENRM_SAMPLING_DEFAULTS, RelaxConfig


def check_algorithm(cfg: RelaxConfig) -> None:
    a = cfg.algo
    if a.kl_coef != 0 and a.kl_loss_coef != 0:
        raise ConfigError("--kl-coef (reward shaping) and --kl-loss-coef (loss) cannot both be non-zero; pick one")
    if a.kl_loss_coef != 0 and not a.use_kl_loss:
        raise ConfigError("--kl-loss-coef is set but --use-kl-loss is not; add --use-kl-loss or drop the coefficient")
    if (a.loss_type == "custom_loss") != bool(a.custom_loss_function_path):
        raise ConfigError("--loss-type custom_loss and --custom-loss-function-path go together: set both or neither")
    if a.custom_tis_function_path and not a.use_tis:
        raise ConfigError("--custom-tis-function-path needs --use-tis (it replaces the TIS weights)")
    if a.eps_clip_c is not None and a.eps_clip_c <= 1.0:
        raise ConfigError(f"--eps-clip-c must be > 1 (dual-clip lower bound), got {a.eps_clip_c}")
    if (a.use_kl_loss or a.kl_coef) and not (cfg.ckpt.ref_load or cfg.ckpt.hf_checkpoint):
        raise ConfigError("--use-kl-loss / --kl-coef need a reference model: set --ref-load (or --hf-checkpoint)")
    if a.ref_update_interval is not None:
        if a.ref_update_interval < 1:
            raise ConfigError(f"--ref-update-interval must be >= 1 (rollout steps), got {a.ref_update_interval}")
        if not (a.use_kl_loss or a.kl_coef):
            raise ConfigError("--ref-update-interval refreshes the reference model, which only runs with "
                              "--use-kl-loss or --kl-coef; add one of them or drop --ref-update-interval")
    check_critic(cfg)
    check_opd(cfg)
    check_no_advantages(cfg)


def check_no_advantages(cfg: RelaxConfig) -> None:
    """--disable-compute-advantages-and-returns (SFT or a custom loss): the Actor trains on rows
    without advantages, so the loss must not need them, and nothing else may."""
    a = cfg.algo
    if not a.disable_compute_advantages_and_returns:
        return
    needs = [why for why, on in (
        ("--loss-type policy_loss weighs every token by its advantage (use --loss-type custom_loss)",
         a.loss_type != "custom_loss"),
        ("--advantage-estimator ppo trains its critic on the returns", a.advantage_estimator == "ppo"),
        ("--fully-async computes advantages in the Advantages role (use --colocate)", cfg.cluster.fully_async),
        ("--kl-coef shapes the rewards that advantages are computed from", a.kl_coef != 0),
        ("--use-opd adds its penalty to the advantages", a.use_opd)) if on]
    if needs:
        raise ConfigError(f"--disable-compute-advantages-and-returns: {needs[0]}")


# Critic flags, which only mean something when a critic is deployed (--advantage-estimator ppo).
CRITIC_FLAGS = ("num_critic_only_steps", "critic_train_only", "critic_lr", "critic_lr_warmup_iters")


def check_critic(cfg: RelaxConfig) -> None:
    a, defaults = cfg.algo, type(cfg.algo)()
    if a.advantage_estimator != "ppo":
        set_flags = [flag_for(n) for n in CRITIC_FLAGS if getattr(a, n) != getattr(defaults, n)]
        set_flags += [flag_for(n) for n in ("critic_load", "critic_save") if getattr(cfg.ckpt, n)]
        if set_flags or Role.CRITIC in (cfg.cluster.resource or {}):
            raise ConfigError(f"{', '.join(set_flags) or '--resource critic'} configure the critic, which only "
                              "--advantage-estimator ppo deploys; add it or drop these flags")
        return
    if a.num_critic_only_steps < 0 or a.critic_lr_warmup_iters < 0:
        raise ConfigError("--num-critic-only-steps and --critic-lr-warmup-iters must be >= 0")
    if a.critic_lr is not None and a.critic_lr <= 0:
        raise ConfigError(f"--critic-lr must be > 0, got {a.critic_lr}")
    if cfg.ckpt.critic_save and not cfg.ckpt.save:
        raise ConfigError("--critic-save: critic checkpoints are written with the actor's; add --save DIR (and "
                          "--save-interval N)")
    if a.value_clip <= 0:
        raise ConfigError(f"--value-clip must be > 0 (the clip range of the value update), got {a.value_clip}")


def check_opd(cfg: RelaxConfig) -> None:
    a = cfg.algo
    if a.advantage_estimator == "on_policy_distillation" and not a.use_opd:
        raise ConfigError("--advantage-estimator on_policy_distillation needs --use-opd --opd-type sglang|megatron "
                          "(OPD now works with any estimator: add --use-opd to grpo, ppo, ...)")
    if not a.use_opd:
        if a.opd_type or a.opd_teacher_load:
            raise ConfigError("--opd-type / --opd-teacher-load need --use-opd; add it or drop them")
        return
    if a.opd_type is None:
        raise ConfigError("--use-opd needs --opd-type: sglang (teacher on an inference engine) or megatron "
                          "(teacher in the training backend)")
    if a.opd_kl_coef <= 0:
        raise ConfigError(f"--opd-kl-coef must be > 0 with --use-opd (it weighs the teacher KL), got {a.opd_kl_coef}")
    if a.opd_type == "megatron" and not a.opd_teacher_load:
        raise ConfigError("--opd-type megatron loads the teacher in the training backend: set --opd-teacher-load DIR")
    if a.opd_type == "sglang" and not (a.opd_teacher_load or cfg.reward.rm_url):
        raise ConfigError("--opd-type sglang needs a teacher engine: --opd-teacher-load DIR (Relax launches one) or "
                          "--rm-url http://HOST:PORT/generate (an external SGLang server)")
    if a.opd_type == "sglang" and not a.opd_teacher_load and cfg.reward.rm_type == "remote_rm":
        raise ConfigError("--rm-url is the reward service of --rm-type remote_rm, so it cannot also be the OPD "
                          "teacher: launch the teacher with --opd-teacher-load DIR instead")
    hf_teacher = a.opd_teacher_ckpt_step is None  # (else a checkpoint directory: checks.ckpt_steps)
    if a.opd_teacher_load and hf_teacher and not (Path(a.opd_teacher_load) / "config.json").is_file():
        raise ConfigError(f"--opd-teacher-load {a.opd_teacher_load}: no config.json there; point it at an HF model "
                          "directory that uses the student's tokenizer")


def check_genrm(cfg: RelaxConfig) -> None:
    r = cfg.reward
    if r.rm_type == "genrm" and not r.genrm_model_path:
        raise ConfigError("--rm-type genrm needs a judge model: set --genrm-model-path PATH (an HF model directory)")
    if not r.genrm_model_path:
        return
    if not (Path(r.genrm_model_path) / "config.json").is_file():
        raise ConfigError(f"--genrm-model-path {r.genrm_model_path}: no config.json there; point it at an HF model "
                          "directory")
    if r.genrm_num_gpus_per_engine < 1 or r.genrm_num_gpus < r.genrm_num_gpus_per_engine or \
            r.genrm_num_gpus % r.genrm_num_gpus_per_engine:
        raise ConfigError(f"--genrm-num-gpus {r.genrm_num_gpus} must be a positive multiple of "
                          f"--genrm-num-gpus-per-engine {r.genrm_num_gpus_per_engine} (engines = their quotient)")
    for flag, value in (("--genrm-engine-config", r.genrm_engine_config),
                        ("--genrm-sampling-config", r.genrm_sampling_config)):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{flag} must be a JSON object, got {value!r}")
    unknown = sorted(set(r.genrm_sampling_config or {}) - set(GENRM_SAMPLING_DEFAULTS))
    if unknown:
        raise ConfigError(f"--genrm-sampling-config: unknown key(s) {unknown}; known keys: "
                          f"{', '.join(GENRM_SAMPLING_DEFAULTS)}")
