import pytest

from relax.engine.rewards import f1


def test_eiffel_tower_partial_overlap_is_two_thirds():
    assert f1.score("The Eiffel Tower", "Eiffel Tower in Paris") == pytest.approx(2 / 3)


def test_normalisation_ignores_case_punctuation_and_articles():
    assert f1.normalise("The  Cat, an apple!") == "cat apple"
    assert f1.score("the CAT.", "a cat") == 1.0


def test_list_label_takes_the_best_match():
    assert f1.score("Paris", ["London", "paris"]) == 1.0


def test_no_overlap_and_empty_sides():
    assert f1.score("dog", "cat") == 0.0
    assert f1.score("the", "a") == 1.0  # both normalise to nothing
    assert f1.score("", "cat") == 0.0
