import pytest

from relax.engine.rewards import openr1mm


def test_well_formed_answer_checked_with_math_verify():
    assert openr1mm.score(r"<think>x</think><answer>\frac{1}{2}</answer>", "0.5") == 1.0
    assert openr1mm.score("<think>x</think><answer>3</answer>", "4") == 0.0


def test_label_wrapped_in_answer_tags():
    assert openr1mm.score("<answer>7</answer>", "<answer>7</answer>") == 1.0


@pytest.mark.parametrize("response", [
    "<answer>1</answer><answer>1</answer>",
    "<think>a</think><think>b</think><answer>1</answer>",
    "<think>a<answer>1</answer>",
    "<answer>1",
    "</answer>1<answer>",
    "<answer>1</answer><think>late</think>",
])
def test_repeated_or_broken_format_scores_zero(response):
    assert openr1mm.score(response, "1") == 0.0


def test_unparseable_answers_fall_back_to_string_match():
    assert openr1mm.score("<answer>Yes</answer>", "yes") == 1.0
