"""Eval plumbing: per-dataset specs and plugin args, eval groups, the eval data source;
context-length capping."""

from __future__ import annotations

import pytest

from relax.components.engine_launch import engine_context_len
from relax.config import parse_config
from relax.config.eval_config import EvalDataset
from relax.engine.rollout.evaluation import EvalDataSource, eval_args, eval_groups
from relax.engine.rollout.generator import fit_to_context, no_room
from relax.engine.specs import RewardSpec, RolloutSpec
from relax.types import Sample


@pytest.fixture()
def cfg(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    return parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
                         "--num-rollout", "1", "--rollout-max-response-len", "8", "--custom-rm-path",
                         "tests.integration.digit_reward.reward_func", "--dynamic-sampling-filter-path",
                         "relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std",
                         "--rollout-max-context-len", "100"])


DATASET = EvalDataset(name="a", path="p", temperature=0.1, top_p=0.5, top_k=3, max_response_len=4, max_context_len=50,
                      stop=["x"], rm_type="f1", reward_key="acc", n_samples_per_eval_prompt=3)


def test_eval_specs_carry_the_datasets_sampling_and_reward(cfg):
    run = RolloutSpec.from_config(cfg)
    spec = run.for_eval(DATASET, num_prompts=7)
    params = spec.sampling.params()
    assert (params["temperature"], params["top_p"], params["top_k"], params["max_new_tokens"]) == (0.1, 0.5, 3, 4)
    assert params["stop"] == ["x"] and spec.sampling.max_context_len == 50 and spec.evaluation
    assert (spec.n_samples_per_prompt, spec.batch_size, spec.dynamic_filter_path) == (3, 7, None)
    rewards = RewardSpec.from_config(cfg.reward).for_eval(DATASET)
    assert (rewards.rm_type, rewards.custom_rm_path, rewards.reward_key) == ("f1", None, "acc")
    assert run.sampling.max_context_len == 100 and run.dynamic_filter_path  # the run's spec is untouched


def test_eval_reward_keeps_the_runs_plugin_when_the_dataset_sets_none(cfg):
    run = RewardSpec.from_config(cfg.reward)
    spec = run.for_eval(EvalDataset(name="a", path="p"))
    assert spec.custom_rm_path == run.custom_rm_path and spec.rm_type is None and spec.scorer == run.scorer


def test_eval_plugin_args_carry_the_dataset_for_custom_eval_functions(cfg):
    args = cfg.args
    out = eval_args(args, DATASET, num_prompts=7)
    assert (out.eval_temperature, out.eval_max_context_len, out.rollout_stop) == (0.1, 50, ["x"])
    assert (out.rm_type, out.custom_rm_path, out.reward_key) == ("f1", None, "acc")
    assert (out.n_samples_per_prompt, out.rollout_batch_size, out.dynamic_sampling_filter_path) == (3, 7, None)
    assert args.rm_type is None and args.custom_rm_path  # the run's args are untouched


def test_eval_groups_index_samples_and_merge_metadata_overrides():
    prompts = [Sample(prompt="a", metadata={"k": 1}), Sample(prompt="b")]
    groups = eval_groups(prompts, EvalDataset(name="x", path="p", n_samples_per_eval_prompt=2,
                                              metadata_overrides={"split": "test"}))
    assert [[s.index for s in g] for g in groups] == [[0, 1], [2, 3]]
    assert [s.group_index for g in groups for s in g] == [0, 0, 1, 1]
    assert groups[0][0].metadata == {"k": 1, "split": "test"} and prompts[0].metadata == {"k": 1}
    assert groups[0][0] is not groups[0][1]


def test_eval_data_source_hands_out_each_group_once():
    source = EvalDataSource([[Sample(index=i)] for i in range(3)])
    assert [g[0].index for g in source.get_samples(2)] == [0, 1]
    assert [g[0].index for g in source.get_samples(2)] == [2]
    assert source.get_samples(1) == []
    with pytest.raises(RuntimeError, match="read-only"):
        source.add_samples([])


@pytest.mark.parametrize("prompt_len, limit, wanted, expected", [
    (10, None, 8, 8), (10, 100, 8, 8), (95, 100, 8, 5), (10, 100, None, 90), (100, 100, 8, None), (120, 100, 8, None),
])
def test_fit_to_context_cuts_max_new_tokens(prompt_len, limit, wanted, expected):
    out = fit_to_context({"max_new_tokens": wanted, "temperature": 1.0}, prompt_len, limit)
    assert (out if out is None else out["max_new_tokens"]) == expected


def test_a_prompt_filling_the_context_gets_an_empty_truncated_response():
    sample = no_room(Sample(prompt="x"), [1, 2, 3])
    assert (sample.tokens, sample.response_length, sample.loss_mask, sample.status) == (
        [1, 2, 3], 0, [], Sample.Status.TRUNCATED)


def test_engine_context_is_the_largest_request_limit():
    sets = [EvalDataset(name="a", path="p", max_context_len=300), EvalDataset(name="b", path="p")]
    assert engine_context_len(200, sets) == 300
    assert engine_context_len(200, []) == 200
    assert engine_context_len(None, sets) is None  # training is unlimited: the model's own limit
