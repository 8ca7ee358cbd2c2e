import pytest

from relax.engine.rewards import multiple_choice


@pytest.mark.parametrize("answer", ["B", "b", "(B)", "B.", "B) Paris"])
def test_letter_answers_match_case_insensitively(answer):
    assert multiple_choice.score(f"reasoning <answer>{answer}</answer>", "B") == 1.0


def test_label_wrapped_in_answer_tags():
    assert multiple_choice.score("<answer>C</answer>", "<answer>C</answer>") == 1.0
    assert multiple_choice.score("<answer>A</answer>", "<answer>C</answer>") == 0.0


def test_missing_answer_tag_scores_zero():
    assert multiple_choice.score("B", "B") == 0.0


def test_text_labels_compare_as_text():
    assert multiple_choice.score("<answer> Paris </answer>", "paris") == 1.0
    assert multiple_choice.score("<answer>Paris</answer>", "London") == 0.0
