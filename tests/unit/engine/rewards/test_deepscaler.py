from relax.engine.rewards import deepscaler


def test_response_without_think_end_scores_zero():
    assert deepscaler.score(r"<think>hmm \boxed{4}", "4") == 0.0


def test_only_the_text_after_think_end_is_graded():
    assert deepscaler.score(r"<think>maybe \boxed{5}</think> so \boxed{4}", "4") == 1.0
    assert deepscaler.score(r"<think>\boxed{4}</think> no box after", "4") == 0.0


def test_math_verify_equivalence_after_think_end():
    assert deepscaler.score(r"<think>x</think>\boxed{\frac{1}{2}}", "0.5") == 1.0
