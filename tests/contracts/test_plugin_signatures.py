"""Plugin contracts: the seed signatures load; wrong ones fail at startup naming the flag and
the expected signature (the same checks `relax-train` runs before Ray starts)."""

from __future__ import annotations

import pytest

from relax.config import ConfigError
from relax.config.checks.plugins import check_plugins
from relax.config.schema import RelaxConfig
from relax.utils.plugins import PluginError, accepts_keyword, load_plugin


async def reward_func(args, sample, **kwargs):
    return 1.0


def sync_reward(args, sample, **kwargs):
    return 0.0


async def group_reward(args, samples, **kwargs):
    return [1.0 for _ in samples]


async def generate(args, sample, sampling_params):
    return sample


async def generate_with_eval(args, sample, sampling_params, evaluation=False):
    return sample


def wrong_reward(sample):
    return 0.0


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    return []


@pytest.mark.parametrize("fn", ["reward_func", "sync_reward", "group_reward"])
def test_reward_signatures_from_the_seeds_load(fn):
    load_plugin(f"{__name__}.{fn}", flag="--custom-rm-path", positional=2, expected="reward_func(args, sample)")


@pytest.mark.parametrize("fn", ["generate", "generate_with_eval"])
def test_generate_signatures_from_the_seeds_load(fn):
    load_plugin(f"{__name__}.{fn}", flag="--custom-generate-function-path", positional=3,
                expected="generate(args, sample, sampling_params[, evaluation])")


def test_optional_evaluation_keyword_is_detected():
    assert accepts_keyword(generate_with_eval, "evaluation") and not accepts_keyword(generate, "evaluation")


def test_wrong_reward_signature_names_flag_and_expected_signature():
    cfg = RelaxConfig().replace(custom_rm_path=f"{__name__}.wrong_reward")
    with pytest.raises(ConfigError, match=r"--custom-rm-path: .*wrong_reward\(sample\) cannot be called as "
                                          r"reward_func\(args, sample, \*\*kwargs\)"):
        check_plugins(cfg)


def test_missing_module_and_missing_attribute_are_named():
    with pytest.raises(PluginError, match="cannot import 'nope_pkg.fn'"):
        load_plugin("nope_pkg.fn", flag="--custom-rm-path", positional=2, expected="x")
    with pytest.raises(PluginError, match="has no attribute 'nope'"):
        load_plugin(f"{__name__}.nope", flag="--custom-rm-path", positional=2, expected="x")


def test_rollout_function_signature():
    check_plugins(RelaxConfig().replace(rollout_function_path=f"{__name__}.generate_rollout"))


def convert_samples_to_train_data(args, samples):
    return {"tokens": [s.tokens for s in samples]}


def convert_without_args(samples):
    return {}


def test_convert_samples_to_train_data_signature_from_the_seeds_loads():
    check_plugins(RelaxConfig().replace(custom_convert_samples_to_train_data_path=f"{__name__}.convert_samples_to_train_data"))
    cfg = RelaxConfig().replace(custom_convert_samples_to_train_data_path=f"{__name__}.convert_without_args")
    with pytest.raises(ConfigError, match=r"--custom-convert-samples-to-train-data-path: .*"
                                          r"convert_samples_to_train_data\(args, samples\)"):
        check_plugins(cfg)


def slime_model_provider(pre_process=True, post_process=True, vp_stage=None):
    return None


def wrapping_model_provider(pre_process, post_process, default_provider, config=None):
    return default_provider(pre_process=pre_process, post_process=post_process)


def model_provider_without_keywords(model):
    return model


@pytest.mark.parametrize("fn", ["slime_model_provider", "wrapping_model_provider"])
def test_model_provider_signatures_load(fn):
    """--custom-model-provider-path: the seeds' (pre_process, post_process[, vp_stage]) and one that asks
    for the default build to wrap (`default_provider`, passed because it names it)."""
    check_plugins(RelaxConfig().replace(custom_model_provider_path=f"{__name__}.{fn}"))


def test_wrong_model_provider_signature_names_flag_and_expected_signature():
    cfg = RelaxConfig().replace(custom_model_provider_path=f"{__name__}.model_provider_without_keywords")
    with pytest.raises(ConfigError, match=r"--custom-model-provider-path: .*model_provider_without_keywords\(model\) "
                                          r"cannot be called as model_provider\(pre_process, post_process"):
        check_plugins(cfg)
