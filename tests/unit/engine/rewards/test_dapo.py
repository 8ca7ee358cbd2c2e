import pytest

from relax.engine.rewards import dapo


def test_wrong_answer_scores_minus_one():
    assert dapo.score("Answer: 41", "42") == {"score": -1.0, "acc": False, "pred": "41"}


def test_right_answer_scores_one():
    assert dapo.score("blah\nAnswer: 42", "42") == {"score": 1.0, "acc": True, "pred": "42"}


def test_only_last_300_characters_count():
    response = "Answer: 42\n" + "x" * 400
    assert dapo.score(response, "42")["pred"] == dapo.INVALID
    assert dapo.score(response, "42")["score"] == -1.0


def test_last_answer_line_wins_and_is_normalised():
    result = dapo.score("Answer: 3\nWait. answer: $1,000$ dollars", "1000")
    assert result["acc"] is True and result["pred"] == "1000"


def test_missing_label_raises():
    with pytest.raises(ValueError, match="label"):
        dapo.score("Answer: 1", None)
