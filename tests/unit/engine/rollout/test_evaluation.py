"""Eval plumbing: per-dataset args, eval groups, the eval data source; context-length capping."""

from __future__ import annotations

from argparse import Namespace

import pytest

from relax.components.rollout import engine_context_len
from relax.config import parse_config
from relax.config.eval_config import EvalDataset
from relax.engine.rollout.evaluation import EvalDataSource, eval_args, eval_groups
from relax.engine.rollout.sglang_rollout import fit_to_context, max_context_len, no_room, sampling_params
from relax.types import Sample


@pytest.fixture()
def args(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    return parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
                         "--num-rollout", "1", "--rollout-max-response-len", "8", "--custom-rm-path",
                         "tests.integration.digit_reward.reward_func", "--dynamic-sampling-filter-path",
                         "relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std",
                         "--rollout-max-context-len", "100"]).args


def test_eval_args_carry_the_datasets_sampling_and_reward(args):
    dataset = EvalDataset(name="a", path="p", temperature=0.1, top_p=0.5, top_k=3, max_response_len=4,
                          max_context_len=50, stop=["x"], rm_type="f1", reward_key="acc", n_samples_per_eval_prompt=3)
    out = eval_args(args, dataset, num_prompts=7)
    params = sampling_params(out, evaluation=True)
    assert (params["temperature"], params["top_p"], params["top_k"], params["max_new_tokens"]) == (0.1, 0.5, 3, 4)
    assert params["stop"] == ["x"] and max_context_len(out, evaluation=True) == 50
    assert (out.rm_type, out.custom_rm_path, out.reward_key) == ("f1", None, "acc")
    assert (out.n_samples_per_prompt, out.rollout_batch_size, out.dynamic_sampling_filter_path) == (3, 7, None)
    assert args.rm_type is None and args.custom_rm_path  # the run's args are untouched


def test_eval_args_keep_the_runs_reward_when_the_dataset_sets_none(args):
    out = eval_args(args, EvalDataset(name="a", path="p"), num_prompts=1)
    assert out.custom_rm_path == args.custom_rm_path and out.rm_type is None


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


def test_eval_context_falls_back_to_the_rollout_one():
    ns = Namespace(eval_max_context_len=None, rollout_max_context_len=64)
    assert max_context_len(ns, evaluation=True) == 64 and max_context_len(ns) == 64
    ns.eval_max_context_len = 32
    assert max_context_len(ns, evaluation=True) == 32 and max_context_len(ns) == 64


def test_a_prompt_filling_the_context_gets_an_empty_truncated_response():
    sample = no_room(Sample(prompt="x"), [1, 2, 3])
    assert (sample.tokens, sample.response_length, sample.loss_mask, sample.status) == (
        [1, 2, 3], 0, [], Sample.Status.TRUNCATED)


def test_engine_context_is_the_largest_request_limit():
    sets = [EvalDataset(name="a", path="p", max_context_len=300), EvalDataset(name="b", path="p")]
    assert engine_context_len(200, sets) == 300
    assert engine_context_len(200, []) == 200
    assert engine_context_len(None, sets) is None  # training is unlimited: the model's own limit
