import pytest

from relax.engine.rewards import math_rm


def test_boxed_fraction_equals_decimal_label():
    assert math_rm.score(r"so the answer is \boxed{\frac{1}{2}}", "0.5") == 1.0


def test_no_boxed_answer_scores_zero():
    assert math_rm.score("the answer is 0.5", "0.5") == 0.0


def test_wrong_answer_scores_zero():
    assert math_rm.score(r"\boxed{3}", "4") == 0.0


def test_fast_path_decides_equal_strings_without_math_verify(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("math-verify must not be called on the fast path")

    monkeypatch.setattr(math_rm, "math_verify_equal", boom)
    assert math_rm.score(r"thus $\boxed{ \dfrac{1}{2} }$.", r"\frac{1}{2}") == 1.0
    assert math_rm.fast_path("no box here", "1") == 0.0


def test_fast_path_leaves_undecided_cases_to_math_verify():
    assert math_rm.fast_path(r"\boxed{\frac{1}{2}}", "0.5") is None


def test_list_label_accepts_any_entry():
    assert math_rm.score(r"\boxed{2}", ["1", "2"]) == 1.0
    assert math_rm.score(r"\boxed{3}", ["1", "2"]) == 0.0


def test_missing_label_raises_naming_the_label_key():
    with pytest.raises(ValueError, match="--label-key"):
        math_rm.score(r"\boxed{1}", None)


def test_plain_numbers_are_decided_without_math_verify():
    from relax.engine.rewards.math_rm import fast_path

    assert fast_path("so \\boxed{8}", "8.0") == 1.0
    assert fast_path("so \\boxed{7}", "8") == 0.0
    assert fast_path("so \\boxed{-0.50}", "-.5") == 1.0
    assert fast_path("so \\boxed{\\frac{1}{2}}", "0.5") is None  # needs math-verify
    assert fast_path("so \\boxed{x}", "8") is None
