"""Two hooks around the training batch: the --custom-convert-samples-to-train-data-path plugin
builds the rows the actor trains on (on the colocate plugin run), and --ref-update-interval hands
the actor's weights to the reference every N steps (the KL to the reference is 0 right after a
refresh and positive in between; on the session's reference run)."""

from __future__ import annotations

import pytest
import torch
from run_helpers import step_rows

from relax.engine.rollout.replay import load_rollout

pytestmark = pytest.mark.integration


def test_convert_samples_plugin_builds_the_training_rows(plugin_run):
    assert (plugin_run / "convert_calls.txt").read_text().split() == ["32"] * 3  # the kept samples of each step
    for step in range(3):
        batch = torch.load(plugin_run / f"train_{step}.pt", weights_only=False)
        samples = sorted((s for g in load_rollout(str(plugin_run / "rollouts" / "step_{rollout_id}.pt"), step)
                          for s in g), key=lambda s: s.index)  # rows are in sample order
        assert batch["loss_masks"] == [[0] + s.loss_mask[1:] for s in samples]


def test_reference_takes_the_actor_weights_every_interval(reference_run):
    steps = step_rows(reference_run / "run")
    kl = [r["train/kl_loss"] for r in steps]
    assert kl[0] == pytest.approx(0.0, abs=1e-5)  # reference and actor start from one checkpoint
    assert kl[1] > 1e-4 and kl[3] > 1e-4  # the actor trained since; the reference did not follow yet
    assert kl[2] == pytest.approx(0.0, abs=1e-5), kl  # refreshed before step 2
    assert [r.get("reference/updated", 0.0) for r in steps] == [0.0, 0.0, 1.0, 0.0]
