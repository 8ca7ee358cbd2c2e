"""Flags that act only with another flag: set without it, each gets a plan note.

`--tis-clip 3` without `--use-tis`, `--lr-decay-iters` under a constant schedule, `--eval-top-p`
with no eval data: the value is valid and would act, but nothing reads it in this run. Rejecting
it would break launch scripts that keep a block of flags for when they switch a feature on, so
it is accepted, and the run logs and `--dry-run` prints a note naming the flag that enables it.
(Combinations that would be silently wrong are errors in `relax.config.checks` instead.)

`INERT` is the registry: flag (config field) -> (what enables it, as the note says it; whether
this config enables it). `inert_flag_notes` gives one note per enabling condition.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from relax.config.fields import field_default, flag_for
from relax.config.schema import FIELD_GROUP, GROUPS, RelaxConfig

Enabled = Callable[[RelaxConfig], bool]


def _eval(cfg: RelaxConfig) -> bool:
    return bool(cfg.eval.eval_prompt_data or cfg.eval.eval_config)


def _reference(cfg: RelaxConfig) -> bool:
    return cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0


def _estimator(*names: str) -> Enabled:
    return lambda cfg: cfg.algo.advantage_estimator in names


def _decay(cfg: RelaxConfig) -> bool:
    return cfg.optim.lr_decay_style != "constant"


def _prefetch(cfg: RelaxConfig) -> bool:
    return cfg.data.use_streaming_dataset and bool(cfg.data.multimodal_keys)


def _metric_sinks(cfg: RelaxConfig) -> bool:
    log = cfg.logging
    return log.use_tensorboard or log.use_wandb or log.use_clearml


GROUP_NORMALIZED = ("grpo", "gspo", "sapo", "on_policy_distillation")
EVAL = ("--eval-prompt-data or --eval-config (no evaluation runs without eval data)", _eval)
DYNAMIC = ("--use-dynamic-batch-size (micro-batches are --micro-batch-size rows without it)",
           lambda cfg: cfg.batch.use_dynamic_batch_size)

# flag (field name) -> (what enables it, whether `cfg` does)
INERT: dict[str, tuple[str, Enabled]] = {
    "tis_clip": ("--use-tis", lambda cfg: cfg.algo.use_tis),
    "tis_clip_low": ("--use-tis", lambda cfg: cfg.algo.use_tis),
    "opsm_delta": ("--use-opsm", lambda cfg: cfg.algo.use_opsm),
    "opd_kl_coef": ("--use-opd", lambda cfg: cfg.algo.use_opd),
    "sapo_tau_pos": ("--advantage-estimator sapo", _estimator("sapo")),
    "sapo_tau_neg": ("--advantage-estimator sapo", _estimator("sapo")),
    "gamma": ("--advantage-estimator ppo or reinforce_plus_plus", _estimator("ppo", "reinforce_plus_plus")),
    "lambd": ("--advantage-estimator ppo (GAE)", _estimator("ppo")),
    "value_clip": ("--advantage-estimator ppo (the critic's loss)", _estimator("ppo")),
    "disable_grpo_std_normalization": (
        "a group-normalized estimator (grpo, gspo, sapo) without --disable-rewards-normalization",
        lambda cfg: cfg.algo.advantage_estimator in GROUP_NORMALIZED and not cfg.algo.disable_rewards_normalization),
    "kl_loss_type": ("--use-kl-loss or --kl-coef (the reference model)", _reference),
    "use_unbiased_kl": ("--use-kl-loss", lambda cfg: cfg.algo.use_kl_loss),
    "lr_decay_iters": ("--lr-decay-style linear or cosine", _decay),
    "min_lr": ("--lr-decay-style linear or cosine", _decay),
    "overlap_cpu_optimizer_d2h_h2d": ("--optimizer-cpu-offload", lambda cfg: cfg.optim.optimizer_cpu_offload),
    "allgather_cp": ("--context-parallel-size > 1", lambda cfg: cfg.parallel.context_parallel_size > 1),
    "streaming_buffer_size": ("--use-streaming-dataset", lambda cfg: cfg.data.use_streaming_dataset),
    "prefetch_chunk_size": ("--use-streaming-dataset with --multimodal-keys", _prefetch),
    "prefetch_max_cached": ("--use-streaming-dataset with --multimodal-keys", _prefetch),
    "prefetch_num_workers": ("--use-streaming-dataset with --multimodal-keys", _prefetch),
    "apply_chat_template_kwargs": ("--apply-chat-template", lambda cfg: cfg.data.apply_chat_template),
    "tb_project_name": ("--use-tensorboard, --use-wandb or --use-clearml", _metric_sinks),
    "tb_experiment_name": ("--use-tensorboard, --use-wandb or --use-clearml", _metric_sinks),
    "max_actor_ckpt_to_keep": ("--save (no checkpoints are written without it)", lambda cfg: bool(cfg.ckpt.save)),
    "no_save_optim": ("--save (no checkpoints are written without it)", lambda cfg: bool(cfg.ckpt.save)),
    "async_save": ("--save (no checkpoints are written without it)", lambda cfg: bool(cfg.ckpt.save)),
    "load_debug_rollout_data_subsample": ("--load-debug-rollout-data",
                                          lambda cfg: bool(cfg.debug.load_debug_rollout_data)),
    "max_tokens_per_gpu": DYNAMIC,
    "log_probs_max_tokens_per_gpu": DYNAMIC,
    "micro_batch_size": ("no --use-dynamic-batch-size (dynamic batches pack by --max-tokens-per-gpu instead)",
                         lambda cfg: not cfg.batch.use_dynamic_batch_size),
    **{name: ("--lora-rank > 0", lambda cfg: cfg.lora.lora_rank > 0)
       for name in ("lora_alpha", "lora_target_modules", "lora_dropout")},
    "genrm_num_gpus": ("--genrm-model-path", lambda cfg: bool(cfg.reward.genrm_model_path)),
    "genrm_num_gpus_per_engine": ("--genrm-model-path", lambda cfg: bool(cfg.reward.genrm_model_path)),
    "genrm_engine_config": ("--genrm-model-path", lambda cfg: bool(cfg.reward.genrm_model_path)),
    "genrm_sampling_config": ("--genrm-model-path", lambda cfg: bool(cfg.reward.genrm_model_path)),
    **{name: ("--use-slime-router", lambda cfg: cfg.router.use_slime_router)
       for name in ("slime_router_middleware_paths", "slime_router_timeout", "slime_router_max_connections",
                    "slime_router_health_check_failure_threshold")},
    **{name: ("--sglang-profile", lambda cfg: cfg.engine_profile.sglang_profile)
       for name in ("sglang_profile_steps", "sglang_profile_step_start", "sglang_profile_step_end",
                    "sglang_profile_output_dir", "sglang_profile_num_steps", "sglang_profile_activities",
                    "sglang_profile_by_stage", "sglang_profile_with_stack", "sglang_profile_record_shapes")},
    **{name: ("--use-pytorch-profiler", lambda cfg: cfg.train_profile.use_pytorch_profiler)
       for name in ("profile_step_start", "profile_step_end", "profile_target", "profile_with_stack",
                    "profile_with_memory", "profile_with_flops")},
    **{name: ("--record-memory-history", lambda cfg: cfg.train_profile.record_memory_history)
       for name in ("memory_snapshot_path", "memory_snapshot_dir", "memory_snapshot_num_steps", "memory_recorder")},
    **{name: EVAL for name in ("eval_interval", "eval_function_path", "eval_input_key", "eval_label_key",
                               "eval_tool_key", "n_samples_per_eval_prompt", "eval_temperature", "eval_top_p",
                               "eval_top_k", "eval_max_response_len", "eval_max_prompt_len", "eval_min_new_tokens",
                               "eval_max_context_len", "eval_reward_key", "skip_eval_before_train", "log_passrate")},
}


def _is_set(cfg: RelaxConfig, name: str) -> bool:
    group = FIELD_GROUP[name]
    f = next(f for f in dataclasses.fields(GROUPS[group]) if f.name == name)
    return getattr(getattr(cfg, group), name) != field_default(f)


def inert_flags(cfg: RelaxConfig) -> dict[str, list[str]]:
    """What enables them -> the flags set in `cfg` that nothing reads without it."""
    by_reason: dict[str, list[str]] = {}
    for name, (needs, enabled) in INERT.items():
        if _is_set(cfg, name) and not enabled(cfg):
            by_reason.setdefault(needs, []).append(flag_for(name))
    return by_reason


def inert_flag_notes(cfg: RelaxConfig) -> list[str]:
    """One plan note per enabling condition that `cfg` lacks, naming the flags it leaves inert."""
    return [f"{' '.join(flags)}: no effect in this run; acts only with {needs}"
            for needs, flags in inert_flags(cfg).items()]
