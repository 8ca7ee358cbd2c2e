"""A vision-language run through the real graph on CPU: rows with inline images and rows with a
video (a frame list, sampled and sized by the video flags), the hf engines taking `image_data` and
`video_data`, the encoder tensors through TransferQueue's `multimodal_train_inputs` column
to the Actor and the Reference, an eval on held-out images, and a bad image row skipped by
--skip-malformed-rows with nothing else lost."""

from __future__ import annotations

import json
import random

import pytest
from run_helpers import check_trained, read_metrics, run_relax, step_rows

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vl_setup(tmp_path_factory):
    from examples.tiny_vision.task import make_row, tokenizer_corpus
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    root = tmp_path_factory.mktemp("tiny_vl")
    build_tiny_vl("qwen2_5_vl", train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300), str(root / "model"))
    rng = random.Random(0)
    rows = [dict(make_row(rng.randint(1, 4), rng), video=[]) for _ in range(24)]
    bad = dict(rows[0], image=["data:image/png;base64,bm90IGFuIGltYWdl"])  # "not an image"
    with open(root / "train.jsonl", "w") as f:
        for row in rows[:10] + [bad] + [video_row(rng) for _ in range(2)] + rows[10:14]:
            f.write(json.dumps(row) + "\n")
    with open(root / "eval.jsonl", "w") as f:
        for row in rows[16:]:
            f.write(json.dumps(row) + "\n")
    return root


def video_row(rng: random.Random) -> dict:
    """A row whose media is one video: 8 frames at 4 fps (2 s), each frame one of the task's images."""
    from examples.tiny_vision.task import QUESTION, data_uri, make_image

    colour = rng.randint(1, 4)
    frames = [data_uri(make_image(colour, rng)) for _ in range(8)]
    return {"prompt": [{"role": "user", "content": QUESTION.replace("<image>", "<video>")}], "image": [],
            "video": [{"frames": frames, "fps": 4}], "label": str(colour)}


def test_vl_grpo_run_trains_on_images(ray_cluster, vl_setup, tmp_path):
    exp = tmp_path / "run"
    summary = run_relax([
        "--hf-checkpoint", str(vl_setup / "model"), "--prompt-data", str(vl_setup / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--multimodal-keys", '{"image": "image", "video": "video"}', "--skip-malformed-rows",
        "--video-fps", "2", "--video-fps-min-frames", "2", "--video-min-token-num", "4", "--video-max-token-num", "4",
        "--save-debug-rollout-data", str(exp / "rollout_{rollout_id}.pt"),
        "--custom-rm-path", "tests.integration.digit_reward.parity_reward", "--reward-num-workers", "1",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
        "--num-rollout", "3", "--lr", "1e-2", "--progress-bar", "false", "--exp-dir", str(exp),
        "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl",
        "--advantage-estimator", "gspo",  # the estimator's run (test_estimators)
        "--eval-interval", "3", "--eval-prompt-data", "heldout", str(vl_setup / "eval.jsonl"),
        "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}'])
    rows = step_rows(exp)
    assert len(rows) == 3
    check_trained(rows)  # gspo: sequence-level ratios of exactly 1 on the first pass
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
    # The third step's prompts include both video rows (no shuffling): 4 of their 8 frames kept
    # (--video-fps 2 of a 2 s clip), each frame 4 tokens (--video-*-token-num 4), so 2 temporal
    # slices of 2x2 merged patches; the engine answered them and the trainer scored them (above).
    from relax.engine.rollout.replay import load_rollout

    videos = [s for g in load_rollout(str(exp / "rollout_{rollout_id}.pt"), 2) for s in g
              if s.multimodal_train_inputs and "video_grid_thw" in s.multimodal_train_inputs]
    assert len(videos) == 8  # 2 prompts x 4 samples
    for s in videos:
        assert s.multimodal_train_inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
        assert s.response_length > 0
    print("VL run: 3 steps on 16 good rows (2 of them videos; 1 corrupt image row skipped), eval",
          summary["heldout"])


def test_vl_grpo_run_on_the_megatron_backend(ray_cluster, vl_setup, tmp_path):
    """The same rows (images and videos) with the Actor on megatron-core
    (vision tower beside the megatron language model: relax/backends/megatron/vision.py), the
    prompts encoded in a pool process (--mm-processor-pool-size 1)."""
    pytest.importorskip("megatron.core")
    exp = tmp_path / "run"
    run_relax([
        "--hf-checkpoint", str(vl_setup / "model"), "--prompt-data", str(vl_setup / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--multimodal-keys", '{"image": "image", "video": "video"}', "--skip-malformed-rows",
        "--video-fps", "2", "--video-fps-min-frames", "2", "--video-min-token-num", "4", "--video-max-token-num", "4",
        "--custom-rm-path", "tests.integration.digit_reward.parity_reward",
        "--reward-num-workers", "1", "--train-backend", "megatron",
        "--mm-processor-pool-size", "1",  # prompts encoded in a process beside the rollout's event loop
        "--advantage-estimator", "sapo",  # the estimator's run (test_estimators)
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
        "--num-rollout", "3", "--lr", "1e-2", "--progress-bar", "false", "--exp-dir", str(exp),
        "--resource", '{"actor": [1, 1], "rollout": [1, 1]}'])
    rows = step_rows(exp)
    assert len(rows) == 3  # the third step's prompts are the two video rows and two image rows
    check_trained(rows)
    for row in rows:
        assert row["train/train_rollout_logprob_abs_diff_max"] < 1e-3
        assert row["train/grad_norm"] > 0
