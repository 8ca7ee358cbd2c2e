"""Every plugin flag names a callable that imports and can be called as Relax will call it.

The dotted path is imported and its signature bound against the call the framework makes
(`relax.utils.plugins.load_plugin`), so a wrong path or signature fails before Ray starts
with the flag and the expected signature, not deep inside a rollout.
"""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig

MODEL_PROVIDER_SIGNATURE = "model_provider(pre_process, post_process[, vp_stage, config, default_provider]) -> model"
ROLLOUT_LOG_SIGNATURE = "custom_rollout_log_function(rollout_id, args, samples, rollout_extra_metrics, rollout_time)"
EVAL_LOG_SIGNATURE = "custom_eval_rollout_log_function(rollout_id, args, data, extra_metrics)"


def check_plugins(cfg: RelaxConfig) -> None:
    """Every plugin flag that is set: (path, flag, positional arguments, the call Relax makes)."""
    specs = [
        (cfg.reward.custom_rm_path, "--custom-rm-path", 2, "reward_func(args, sample, **kwargs)"),
        (cfg.rollout.custom_generate_function_path, "--custom-generate-function-path", 3,
         "generate(args, sample, sampling_params[, evaluation])"),
        (cfg.rollout.rollout_function_path, "--rollout-function-path", 3,
         "generate_rollout(args, rollout_id, data_source, evaluation=False)"),
        (cfg.data.custom_prompt_path, "--custom-prompt-path", 2, "fn(prompt, data)"),
        (cfg.eval.eval_function_path, "--eval-function-path", 3,
         "generate_rollout(args, rollout_id, data_source, evaluation=True)"),
        (cfg.reward.custom_reward_post_process_path, "--custom-reward-post-process-path", 2,
         "fn(args, samples) -> (raw_rewards, rewards)"),
        (cfg.algo.custom_loss_function_path, "--custom-loss-function-path", 2,
         "custom_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig)"),
        (cfg.rollout.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path", 2,
         "filter(args, samples, **kwargs) -> bool | DynamicFilterOutput"),
        (cfg.reward.custom_convert_samples_to_train_data_path, "--custom-convert-samples-to-train-data-path", 2,
         "convert_samples_to_train_data(args, samples) -> dict"),
        (cfg.rollout.rollout_data_postprocess_path, "--rollout-data-postprocess-path", 3,
         "fn(args, rollout_id, rollout_data)"),
        (cfg.rollout.custom_rollout_log_function_path, "--custom-rollout-log-function-path", 5,
         ROLLOUT_LOG_SIGNATURE),
        (cfg.rollout.custom_eval_rollout_log_function_path, "--custom-eval-rollout-log-function-path", 4,
         EVAL_LOG_SIGNATURE),
    ]
    for path, flag, positional, expected in specs:
        if path:
            check_plugin(path, flag, positional, expected)
    if cfg.megatron.custom_model_provider_path:
        check_model_provider(cfg.megatron.custom_model_provider_path)


def check_plugin(path: str, flag: str, positional: int, expected: str) -> None:
    """`path` imports and takes `positional` arguments as `expected` shows; ConfigError naming `flag` if not."""
    from relax.utils.plugins import PluginError, load_plugin

    try:
        load_plugin(path, flag=flag, positional=positional, expected=expected)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc


def check_model_provider(path: str) -> None:
    """--custom-model-provider-path: called with keywords (`pre_process=`, `post_process=`, and each
    optional one it names), as the megatron backend calls it."""
    from relax.utils.plugins import PluginError, load_plugin

    try:
        load_plugin(path, flag="--custom-model-provider-path", positional=0, keywords=("pre_process", "post_process"),
                    optional=("vp_stage", "config", "default_provider"), expected=MODEL_PROVIDER_SIGNATURE)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
