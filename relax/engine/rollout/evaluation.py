"""Evaluation: one eval dataset (`relax.config.eval_config.EvalDataset`) through a rollout function.

The eval function (`--eval-function-path`, default `--rollout-function-path`) has the rollout
function's signature and is called once per dataset as `fn(args, rollout_id, data_source,
evaluation=True)`:

- `args` is a copy of the run's args with the dataset's settings in the flags the generate and
  reward code already read: `eval_temperature`, `eval_top_p`, `eval_top_k`,
  `eval_max_response_len`, `eval_min_new_tokens`, `eval_max_context_len`, `rollout_stop`,
  `rollout_stop_token_ids`, `custom_generate_function_path`, `reward_key`, and (when the
  dataset sets `rm_type`) `rm_type` with no `custom_rm_path`. `n_samples_per_prompt` is the
  dataset's samples per prompt and `rollout_batch_size` its number of prompts, so the default
  rollout function evaluates the whole set in one call; dynamic sampling is off.
- `data_source` is an `EvalDataSource`: `get_samples(n)` hands out the next n of the dataset's
  groups (n copies of each prompt with indices `p * n + j`).
- it returns the scored groups (`list[list[Sample]]`), as a rollout function does.
"""

from __future__ import annotations

import copy
from argparse import Namespace
from typing import Any

from relax.config.eval_config import EvalDataset
from relax.types import Sample

EVAL_FUNCTION_SIGNATURE = "generate_rollout(args, rollout_id, data_source, evaluation=True) -> list[list[Sample]]"


def eval_args(args: Any, dataset: EvalDataset, num_prompts: int) -> Namespace:
    """A copy of `args` carrying `dataset`'s generation and reward settings (see module doc)."""
    out = Namespace(**vars(args))
    out.rollout_batch_size = num_prompts
    out.eval_temperature, out.eval_top_p, out.eval_top_k = dataset.temperature, dataset.top_p, dataset.top_k
    out.eval_max_response_len = dataset.max_response_len
    out.eval_min_new_tokens = dataset.min_new_tokens
    out.eval_max_context_len = dataset.max_context_len
    out.rollout_stop = list(dataset.stop) if dataset.stop else None
    out.rollout_stop_token_ids = list(dataset.stop_token_ids) if dataset.stop_token_ids else None
    out.custom_generate_function_path = dataset.custom_generate_function_path
    out.reward_key = dataset.reward_key
    if dataset.rm_type:
        out.rm_type, out.custom_rm_path, out.group_rm = dataset.rm_type, None, False
    out.n_samples_per_prompt = dataset.n_samples_per_eval_prompt
    out.over_sampling_batch_size = None
    out.dynamic_sampling_filter_path = None
    return out


def eval_groups(prompts: list[Sample], dataset: EvalDataset) -> list[list[Sample]]:
    """`n_samples_per_eval_prompt` copies of each prompt, indexed `p * n + j`, with the
    dataset's `metadata_overrides` merged into each sample's metadata."""
    n = dataset.n_samples_per_eval_prompt
    groups = []
    for p, prompt in enumerate(prompts):
        group = []
        for j in range(n):
            sample = copy.deepcopy(prompt)
            sample.index, sample.group_index = p * n + j, p
            sample.metadata = {**(sample.metadata or {}), **dataset.metadata_overrides}
            group.append(sample)
        groups.append(group)
    return groups


class EvalDataSource:
    """The groups of one eval dataset, handed out in order (a data source for the eval function)."""

    def __init__(self, groups: list[list[Sample]]) -> None:
        self._groups = groups
        self._next = 0

    def __len__(self) -> int:
        return len(self._groups)

    def get_samples(self, num_samples: int, *, rollout_id: int | None = None) -> list[list[Sample]]:
        taken = self._groups[self._next:self._next + num_samples]
        self._next += len(taken)
        return taken

    def add_samples(self, samples: list[list[Sample]]) -> None:
        raise RuntimeError("EvalDataSource is read-only: an eval function evaluates every group it is given")
