"""`--rollout-data-postprocess-path` (`relax.components.train_hooks`): the hook sees the step's
columns and what it edits or assigns is what trains; a wrong signature or mode fails at parse."""

from __future__ import annotations

import pytest

from relax.components.train_hooks import load_postprocess, postprocess_rows
from relax.config import ConfigError, parse_config
from relax.types import TrainBatch


def mask_first_token(args, rollout_id, rollout_data):
    for mask in rollout_data["loss_masks"]:
        mask[0] = 0


def drop_negative_advantages(args, rollout_id, rollout_data):
    rollout_data["advantages"] = [[max(a, 0.0) for a in row] for row in rollout_data["advantages"]]
    args.seen_step = rollout_id


def resize(args, rollout_id, rollout_data):
    rollout_data["loss_masks"] = rollout_data["loss_masks"][:1]


def two_args(args, rollout_data):
    return None


class Args:
    pass


def batch() -> TrainBatch:
    return TrainBatch(tokens_RL=[[1, 2, 3], [4, 5, 6]], response_lengths_R=[2, 2], loss_masks_RT=[[1, 1], [1, 1]],
                      advantages_RT=[[0.5, -0.5], [-1.0, 1.0]], rewards_R=[1.0, 0.0])


def test_in_place_edits_reach_the_batch():
    b = batch()
    assert postprocess_rows(load_postprocess(f"{__name__}.mask_first_token"), Args(), 3, b) == []
    assert b.loss_masks_RT == [[0, 1], [0, 1]]


def test_assigned_columns_replace_the_batch_s():
    b, args = batch(), Args()
    assert postprocess_rows(drop_negative_advantages, args, 7, b) == ["advantages"]
    assert b.advantages_RT == [[0.5, 0.0], [0.0, 1.0]] and args.seen_step == 7


def test_a_resized_column_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match="--rollout-data-postprocess-path: .*'loss_masks'.* 1 rows; the step has 2"):
        postprocess_rows(resize, Args(), 0, batch())


def test_validation_checks_the_signature_and_the_mode(base):
    parse_config(base + ["--rollout-data-postprocess-path", f"{__name__}.mask_first_token"])
    with pytest.raises(ConfigError, match=r"cannot be called as fn\(args, rollout_id, rollout_data\)"):
        parse_config(base + ["--rollout-data-postprocess-path", f"{__name__}.two_args"])
    with pytest.raises(ConfigError, match="use it with --colocate"):
        parse_config(base + ["--fully-async", "--rollout-data-postprocess-path", f"{__name__}.mask_first_token"])
