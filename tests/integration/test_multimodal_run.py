"""A vision-language run through the real graph on CPU: rows with inline images, the hf engines
taking `image_data`, the encoder tensors through TransferQueue's `multimodal_train_inputs` column
to the Actor and the Reference, an eval on held-out images, and a bad image row skipped by
--skip-malformed-rows with nothing else lost."""

from __future__ import annotations

import json
import random

import pytest
from run_helpers import read_metrics, run_relax, step_rows

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vl_setup(tmp_path_factory):
    from examples.tiny_vision.task import make_row, tokenizer_corpus
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    root = tmp_path_factory.mktemp("tiny_vl")
    build_tiny_vl("qwen2_5_vl", train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300), str(root / "model"))
    rng = random.Random(0)
    rows = [make_row(rng.randint(1, 4), rng) for _ in range(24)]
    bad = dict(rows[0], image=["data:image/png;base64,bm90IGFuIGltYWdl"])  # "not an image"
    with open(root / "train.jsonl", "w") as f:
        for row in rows[:12] + [bad] + rows[12:16]:
            f.write(json.dumps(row) + "\n")
    with open(root / "eval.jsonl", "w") as f:
        for row in rows[16:]:
            f.write(json.dumps(row) + "\n")
    return root


def test_vl_grpo_run_trains_on_images(ray_cluster, vl_setup, tmp_path):
    exp = tmp_path / "run"
    summary = run_relax([
        "--hf-checkpoint", str(vl_setup / "model"), "--prompt-data", str(vl_setup / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--multimodal-keys", '{"image": "image"}', "--skip-malformed-rows",
        "--custom-rm-path", "tests.integration.digit_reward.parity_reward",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
        "--num-rollout", "3", "--lr", "1e-2", "--progress-bar", "false", "--exp-dir", str(exp),
        "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl",
        "--eval-interval", "3", "--eval-prompt-data", "heldout", str(vl_setup / "eval.jsonl"),
        "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}'])
    rows = step_rows(exp)
    assert len(rows) == 3
    for row in rows:
        # The first step trains on what the engine sampled: the trainer's recomputed log-probs
        # match the engine's only if both saw the same pixels and positions.
        assert row["train/train_rollout_logprob_abs_diff_max"] < 1e-3
        assert row["train/grad_norm"] > 0
    assert set(summary["heldout"]) >= {"before", "after"}
    evals = [r for r in read_metrics(exp) if "eval/heldout/reward_mean" in r]
    assert len(evals) == 2  # before training and at step 3
    # The corrupt image (the 13th row) was checked at load and skipped: without
    # --skip-malformed-rows the run fails at start-up naming it (tests/unit/utils/data).
    print("VL run: 3 steps on 16 good rows (1 corrupt image row skipped), eval", summary["heldout"])
