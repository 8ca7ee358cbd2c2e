import pytest

from relax.engine.rewards import REWARD_TYPES, grade, resolve
from relax.engine.rewards import registry


def test_every_documented_type_is_registered():
    assert set(REWARD_TYPES) == {"math", "deepscaler", "dapo", "gpqa", "f1", "multiple_choice", "openr1mm",
                                 "ifbench", "remote_rm", "genrm"}


def test_unknown_type_raises_listing_known_types():
    with pytest.raises(ValueError, match=r"unknown rm_type 'nope'.*'math'.*boxed_<type>"):
        grade("nope", "x", "y")


def test_grade_public_cases():
    assert grade("math", r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert grade("deepscaler", r"\boxed{4}", "4") == 0.0
    assert grade("dapo", "Answer: 41", "42")["score"] == -1.0
    assert grade("f1", "The Eiffel Tower", "Eiffel Tower in Paris") == pytest.approx(2 / 3)


def test_boxed_prefix_applies_inner_type_to_boxed_content():
    assert grade("boxed_f1", r"noise words \boxed{Eiffel Tower}", "eiffel tower") == 1.0
    assert grade("boxed_multiple_choice", r"\boxed{<answer>B</answer>}", "B") == 1.0
    assert grade("boxed_f1", "no box at all", "eiffel tower") == 0.0


def test_boxed_prefix_rejects_async_and_unknown_inner_types():
    with pytest.raises(ValueError, match="sync types only"):
        resolve("boxed_remote_rm")
    with pytest.raises(ValueError, match="unknown rm_type 'nope'"):
        resolve("boxed_nope")


def test_fast_path_decides_pure_string_types_and_defers_math_verify():
    assert registry.fast_grade("f1", "a b", "a b") == 1.0
    assert registry.fast_grade("math", r"\boxed{0.5}", "0.5") == 1.0
    assert registry.fast_grade("math", r"\boxed{\frac{1}{2}}", "0.5") is None
    assert registry.fast_grade("remote_rm", "r", "l") is None


def test_grade_uses_the_same_path_as_the_executor(monkeypatch):
    calls = []
    monkeypatch.setitem(registry.FAST_PATHS, "math", lambda *a: calls.append("fast") or None)
    monkeypatch.setitem(registry.REWARD_TYPES, "math", lambda *a: calls.append("full") or 0.25)
    assert grade("math", "r", "l") == 0.25
    assert calls == ["fast", "full"]
