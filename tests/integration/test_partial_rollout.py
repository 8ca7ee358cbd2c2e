"""Partial rollout on CPU: fully-async mode where each weight push aborts in-flight requests.

With --max-staleness 1 the Rollout generates step k+1 while the Actor trains step k, and the
push that follows aborts whatever is still generating. Decoding is sequential per token while
training on the tiny model is not, so long responses (up to 512 tokens, on a copy of the tiny
model with a longer context) and over-sampling (8 groups generated per step, 4 trained) make
generation outlast a training step: the pushes land mid-generation.

Checked: aborted samples were resumed and completed; their responses continue across the
abort (weight versions rise, the tokens of the older weights are masked); the per-step
metrics count at least the resumed samples and masked tokens that were trained on (they also
count the surplus groups over-sampling generated and returned); no trained row lags more
than the bound; training completes.
"""

from __future__ import annotations

import pytest
from run_helpers import run_relax as run
from run_helpers import check_trained, step_rows

from relax.engine.rollout.replay import load_rollout
from relax.types import Sample

pytestmark = pytest.mark.integration

STEPS = 4
MAX_RESPONSE = 512


@pytest.fixture(scope="module")
def long_model(tiny_setup, tmp_path_factory):
    """The session's tiny model and tokenizer, rebuilt with room for long responses."""
    from transformers import AutoTokenizer

    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_setup / "model"))
    path = tmp_path_factory.mktemp("long") / "model"
    save_tiny_model(build_tiny_qwen3(tokenizer, max_position_embeddings=1024), tokenizer, str(path))
    return path


def args(root, model, exp_dir) -> list[str]:
    return ["--hf-checkpoint", str(model), "--prompt-data", str(root / "train.jsonl"),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
            "--custom-rm-path", "tests.integration.digit_reward.reward_func",
            "--reward-num-workers", "1", "--rollout-shuffle",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--over-sampling-batch-size", "8",
            "--rollout-max-response-len", str(MAX_RESPONSE), "--lr", "1e-2", "--progress-bar", "false",
            "--num-rollout", str(STEPS), "--exp-dir", str(exp_dir),
            "--fully-async", "--max-staleness", "1", "--partial-rollout", "--mask-offpolicy-in-partial-rollout",
            "--save-debug-rollout-data", str(exp_dir / "rollouts" / "step_{rollout_id}.pt"),
            "--use-rollout-logprobs",  # no ActorFwd: old log-probs are the concatenated rollout ones
            "--advantage-estimator", "reinforce_plus_plus_baseline",  # in the Advantages role (test_estimators)
            "--resource", '{"actor": [1, 1], "rollout": [1, 1], "advantages": [1, 0]}']


def check_resumed(sample: Sample) -> int:
    """A resumed sample's response spans the abort(s); returns its masked (older-weights) tokens."""
    versions = sample.weight_versions
    assert len(versions) == 1 + sample.abort_count and versions == sorted(versions), versions
    assert versions[-1] > versions[0], f"sample {sample.index} did not continue on newer weights: {versions}"
    masked = sample.loss_mask.index(1) if 1 in sample.loss_mask else len(sample.loss_mask)
    assert sample.loss_mask == [0] * masked + [1] * (sample.response_length - masked), sample.loss_mask
    return masked


def test_aborted_samples_are_resumed_and_training_completes(ray_cluster, tiny_setup, long_model, tmp_path):
    run(args(tiny_setup, long_model, tmp_path))
    rows = {r["step"]: r for r in step_rows(tmp_path)}
    assert sorted(rows) == list(range(STEPS))
    check_trained(list(rows.values()), single_pass=False)  # off-policy by up to one version

    samples = [s for step in rows for g in load_rollout(str(tmp_path / "rollouts" / "step_{rollout_id}.pt"), step)
               for s in g]
    for s in samples:  # every trained sample is whole: no abort left unresumed, columns aligned
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED), s.status
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length <= MAX_RESPONSE
    resumed = [s for s in samples if s.abort_count > 0]
    assert resumed, "no sample was aborted by a weight push; the test no longer exercises partial rollout"
    masked = sum(check_resumed(s) for s in resumed)
    assert masked > 0, "resumed samples carried no tokens across an abort"
    assert all(s.loss_mask == [1] * s.response_length for s in samples if s.abort_count == 0)

    # Metrics cover every generated sample: the trained ones and the surplus that went back.
    assert sum(r["rollout/partial_resumed_samples"] for r in rows.values()) >= len(resumed)
    assert sum(r["rollout/partial_offpolicy_masked_tokens"] for r in rows.values()) >= masked
    assert sum(r["rollout/partial_aborts"] for r in rows.values()) >= sum(s.abort_count for s in resumed)
    assert len(samples) == STEPS * 4 * 4  # over-sampling: only rollout_batch_size groups per step are trained

    lags = [rows[s]["train/max_version_lag"] for s in rows]
    assert max(lags) <= 1, lags
    assert all(rows[s]["train/rejected_stale_rows"] == 0 for s in rows)
