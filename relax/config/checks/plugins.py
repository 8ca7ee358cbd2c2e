"""Every plugin flag names a callable that imports and can be called as Relax will call it.

The dotted path is imported and its signature bound against the call the framework makes
(`relax.utils.plugins.load_plugin`), so a wrong path or signature fails before Ray starts
with the flag and the expected signature, not deep inside a rollout.
"""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.fields import flag_for
from relax.config.schema import RelaxConfig

MODEL_PROVIDER_SIGNATURE = "model_provider(pre_process, post_process[, vp_stage, config, default_provider]) -> model"
ROLLOUT_LOG_SIGNATURE = "custom_rollout_log_function(rollout_id, args, samples, rollout_extra_metrics, rollout_time)"
EVAL_LOG_SIGNATURE = "custom_eval_rollout_log_function(rollout_id, args, data, extra_metrics)"


# field -> (its config group, positional arguments, the call Relax makes) of every plugin flag.
PLUGINS: dict[str, tuple[str, int, str]] = {
    "custom_rm_path": ("reward", 2, "reward_func(args, sample, **kwargs)"),
    "custom_generate_function_path": ("rollout", 3, "generate(args, sample, sampling_params[, evaluation])"),
    "rollout_function_path": ("rollout", 3, "generate_rollout(args, rollout_id, data_source, evaluation=False)"),
    "custom_prompt_path": ("data", 2, "fn(prompt, data)"),
    "eval_function_path": ("eval", 3, "generate_rollout(args, rollout_id, data_source, evaluation=True)"),
    "custom_reward_post_process_path": ("reward", 2, "fn(args, samples) -> (raw_rewards, rewards)"),
    "custom_loss_function_path": ("algo", 2, "custom_loss(inputs: PolicyLossInputs, cfg: PolicyLossConfig)"),
    "dynamic_sampling_filter_path": ("rollout", 2, "filter(args, samples, **kwargs) -> bool | DynamicFilterOutput"),
    "custom_convert_samples_to_train_data_path": ("reward", 2, "convert_samples_to_train_data(args, samples) -> dict"),
    "rollout_data_postprocess_path": ("rollout", 3, "fn(args, rollout_id, rollout_data)"),
    "custom_rollout_log_function_path": ("rollout", 5, ROLLOUT_LOG_SIGNATURE),
    "custom_eval_rollout_log_function_path": ("rollout", 4, EVAL_LOG_SIGNATURE),
}


def check_plugins(cfg: RelaxConfig) -> None:
    """Every plugin flag that is set (`PLUGINS`) imports and takes the call Relax makes."""
    for name, (group, positional, expected) in PLUGINS.items():
        path = getattr(getattr(cfg, group), name)
        if path:
            check_plugin(path, flag_for(name), positional, expected)
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
