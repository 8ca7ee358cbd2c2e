import pytest

from relax.engine.rewards import gpqa


@pytest.mark.parametrize("response", [
    "Thinking... The answer is (B).",
    "Answer: B",
    r"so \boxed{B}",
    r"so \boxed{\text{(B)}}",
    "The correct answer is: **B**",
    "<answer>B</answer>",
    "answer: (b)",
    "B",
])
def test_common_phrasings_extract_the_letter(response):
    assert gpqa.extract_letter(response) == "B"
    assert gpqa.score(response, "B") == 1.0


def test_the_last_commitment_wins():
    assert gpqa.score("I first thought the answer is (A) but the answer is (C)", "C") == 1.0


def test_article_a_is_not_read_as_choice_a():
    assert gpqa.extract_letter("the answer is a function of x") is None


def test_correct_letter_from_metadata_overrides_label():
    assert gpqa.score("Answer: D", "some option text", {"correct_letter": "D"}) == 1.0
    assert gpqa.score("Answer: C", "some option text", {"correct_letter": "D"}) == 0.0


def test_label_text_found_among_choices_gives_its_letter():
    metadata = {"choices": ["red", "green", "blue"]}
    assert gpqa.score("The answer is (C)", "blue", metadata) == 1.0


def test_unusable_label_raises_a_clear_error():
    with pytest.raises(ValueError, match="correct_letter"):
        gpqa.score("Answer: A", "no idea", {})
