"""On-policy distillation through the real graph: with a zero task reward the teacher's KL
penalty is the only signal, and the student's KL to the teacher must fall within a few steps,
whether the teacher runs on an inference engine (sglang type, here the hf engine scoring over
/generate, in fully-async mode) or in the training backend (megatron type, colocate)."""

from __future__ import annotations

import pytest
from run_helpers import step_rows, run_relax

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models(tiny_setup, tmp_path_factory):
    """(student, teacher): the student half knows the response format (30 SFT steps); the teacher is
    wider and trained for longer. Their KL on the student's samples is ~2.5 nats per token, most
    of it format the student can fix in a few steps (measured: ~0.7 after 3-4 steps)."""
    from opd_helpers import build_sft_model

    tok = str(tiny_setup / "model")
    student = build_sft_model(tok, str(tmp_path_factory.mktemp("student")), hidden_size=64, steps=30, seed=1)
    teacher = build_sft_model(tok, str(tmp_path_factory.mktemp("teacher")), hidden_size=96, steps=60, seed=2)
    return student, teacher


MODES = {
    "colocate": ["--resource", '{"actor": [1, 1], "rollout": [1, 1]}'],
    # Staleness 0: the penalty is then computed with the policy being trained, as in colocate. At
    # this test's learning rate (1e-2, to see the KL fall in 5 steps) a penalty one version stale
    # overshoots (measured: the KL falls at step 2, then climbs back above 2); docs/fully-async.md.
    # The old log-probs are the engine's (no ActorFwd: at staleness 0 they are the trained policy's).
    "fully_async": ["--fully-async", "--max-staleness", "0", "--use-rollout-logprobs", "--resource",
                    '{"actor": [1, 1], "rollout": [1, 1], "teacher": [1, 1], "advantages": [1, 0]}'],
}


def opd_args(root, models, exp_dir, opd_type: str, mode: str) -> list[str]:
    student, teacher = models
    return [
        "--hf-checkpoint", student, "--prompt-data", str(root / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.integration.opd_helpers.zero_reward", "--reward-num-workers", "1",
        "--use-opd", "--opd-type", opd_type, "--opd-teacher-load", str(teacher), "--opd-kl-coef", "1.0",
        "--normalize-advantages", "--rollout-batch-size", "8", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "12", "--num-rollout", "5", "--lr", "1e-2", "--rollout-shuffle",
        "--progress-bar", "false",
        "--exp-dir", str(exp_dir), *MODES[mode],
    ]


# Each teacher type once; the engine teacher streams in fully-async mode (the Teacher role's run).
@pytest.mark.parametrize("opd_type, mode", [("sglang", "fully_async"), ("megatron", "colocate")])
def test_student_kl_to_the_teacher_falls(ray_cluster, tiny_setup, models, tmp_path, opd_type, mode):
    run_relax(opd_args(tiny_setup, models, tmp_path, opd_type, mode))
    kls = [r["opd/kl_to_teacher"] for r in step_rows(tmp_path)]
    assert len(kls) == 5
    assert kls[0] > 1.0, kls  # the student starts far from the teacher
    # At this learning rate the KL falls fast and can overshoot for a step (measured with
    # transformers 5.24: [2.31, 1.14, 0.78, 1.92, 1.00]): the best late step and the last step
    # are both well below the start.
    assert min(kls[2:]) < 0.4 * kls[0] and kls[-1] < 0.6 * kls[0], kls
