"""Rollout routing replay (R3) end to end on a tiny Qwen3-MoE (colocate, fsdp + hf): the hf engine
serves the model in bfloat16 (the setup where its routing differs from the float32 trainer's,
tests/unit/backends/routing_cases.py), records every token's experts, the Rollout writes them as the
`rollout_routed_experts` column and the trainer replays them: the first step's per-token
engine/trainer log-prob difference stays at a dense model's level (unit tests: without R3 its max
is ~10x larger on the same model). Two steps, one short run."""

from __future__ import annotations

import pytest
from run_helpers import check_trained, run_relax, step_rows

from relax.engine.rollout.replay import load_rollout

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moe_model(tiny_setup, tmp_path_factory):
    from transformers import AutoTokenizer

    from relax.utils.tiny_model import build_tiny_qwen3_moe, save_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_setup / "model"))
    return save_tiny_model(build_tiny_qwen3_moe(tokenizer), tokenizer, str(tmp_path_factory.mktemp("moe") / "model"))


def test_r3_keeps_the_first_step_mismatch_at_the_dense_level(ray_cluster, tiny_setup, moe_model, tmp_path):
    exp = tmp_path / "run"
    run_relax(["--hf-checkpoint", moe_model, "--prompt-data", str(tiny_setup / "train.jsonl"), "--input-key", "prompt",
               "--label-key", "label", "--apply-chat-template", "--custom-rm-path",
               "tests.integration.digit_reward.reward_func",
               "--reward-num-workers", "1", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
               "--rollout-max-response-len", "8", "--lr", "1e-2", "--progress-bar", "false", "--num-rollout", "2",
               "--exp-dir", str(exp), "--resource", '{"actor": [1, 1], "rollout": [1, 1]}',
               "--use-rollout-routing-replay", "--sglang-dtype", "bfloat16",
               "--save-debug-rollout-data", str(exp / "rollouts" / "step_{rollout_id}.pt")])
    rows = step_rows(exp)
    check_trained(rows)
    first = rows[0]
    print(f"\nR3 first step |train - rollout| log-prob: mean {first['train/train_rollout_logprob_abs_diff_mean']:.5f}"
          f" max {first['train/train_rollout_logprob_abs_diff_max']:.5f}")
    assert first["train/train_rollout_logprob_abs_diff_max"] < 0.1  # the dense level is ~0.04 (routing_cases)
    assert first["train/train_rollout_logprob_abs_diff_mean"] < 0.02
    samples = [s for g in load_rollout(str(exp / "rollouts" / "step_{rollout_id}.pt"), 0) for s in g]
    assert samples and all(s.rollout_routed_experts.shape == (len(s.tokens) - 1, 2, 2) for s in samples)
