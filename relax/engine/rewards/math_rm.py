"""`math`: the last `\\boxed{...}` of the response against the label, via math-verify.

Rules: no boxed answer -> 0.0. Fast path: if the normalised strings are equal -> 1.0 without
calling math-verify (string work costs microseconds; math-verify costs about a millisecond, is not
thread-safe and can hang, so the executor sends only the undecided cases to worker processes).
Otherwise 1.0 if `math_verify.verify(parse(label), parse(answer))`, else 0.0. A list label means
"any of these": 1.0 if the answer matches one of them.

`normalise` is deliberately conservative: it only removes spelling differences that can never
change the value (spaces, `$`, `\\left`/`\\right`, thin spaces, `\\dfrac` -> `\\frac`, a trailing
period, degree marks, a whole-answer `\\text{}`), so the fast path has no false positives.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any, Callable

from relax.engine.rewards.extract import label_text, last_boxed

_REMOVED = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "^{\\circ}", "^\\circ")


def normalise(answer: str) -> str:
    """A canonical spelling of a short math answer, used only for the exact-match fast path."""
    text = answer.strip()
    match = re.fullmatch(r"\\text\{(.*)\}", text)
    if match:
        text = match.group(1)
    for token in _REMOVED:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\s+", "", text)
    return text.rstrip(".")


# A plain decimal literal (optional sign, digits, optional fraction part): its value is its
# spelling, so two of them are equal exactly when their Fractions are; no math-verify needed.
_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def as_decimal(text: str) -> Fraction | None:
    return Fraction(text) if _DECIMAL.fullmatch(text) else None


def fast_path(response: str, label: Any, metadata: dict | None = None) -> float | None:
    """0.0 / 1.0 when string work decides the answer, None when math-verify is needed.

    Decided here: no boxed answer (0), equal normalised spellings (1), and answer and every gold
    answer being plain decimal literals (compared exactly as numbers: `8` vs `8.0` -> 1, `7` vs
    `8` -> 0). Anything else (fractions, expressions, sets, units) goes to math-verify.
    """
    answer = last_boxed(response)
    if answer is None:
        return 0.0
    answer = normalise(answer)
    golds = [normalise(gold) for gold in gold_answers(label)]
    if answer in golds:
        return 1.0
    value, gold_values = as_decimal(answer), [as_decimal(g) for g in golds]
    if value is not None and all(g is not None for g in gold_values):
        return 1.0 if value in gold_values else 0.0
    return None


def gold_answers(label: Any) -> list[str]:
    """The accepted answers: one for a scalar label, each entry of a list/tuple label."""
    items = label if isinstance(label, (list, tuple)) else [label]
    if not items:
        raise ValueError("label is an empty list; give at least one accepted answer")
    return [label_text(item) for item in items]


def math_equal(answer: str, gold: str) -> bool:
    """True when `answer` equals `gold` as strings after `normalise`, or by math-verify."""
    if normalise(answer) == normalise(gold):
        return True
    return verify_with_math_verify(answer, gold)


def verify_with_math_verify(answer: str, gold: str) -> bool:
    """math-verify equivalence of two LaTeX answers; False when either side cannot be parsed."""
    return bool(math_verify_equal(answer, gold))


def math_verify_equal(answer: str, gold: str) -> bool | None:
    """math-verify equivalence (both wrapped in `\\boxed{}` for parsing); None if unparseable.

    math-verify's own timeouts use SIGALRM, which only works in a main thread; elsewhere they
    are switched off and the caller (the reward executor) enforces the deadline instead.
    """
    from math_verify import parse, verify  # lazy: sympy import costs ~0.3 s

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
    answer_parsed = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if not gold_parsed or not answer_parsed:
        return None
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))


def decided(fast: float | None, answer: str | None, golds: list[str], equal: Callable[[str, str], bool]) -> float:
    """The score: the fast path's verdict when it decided, else 1.0 when `equal` accepts the
    answer for any gold answer (the slow path, math-verify)."""
    if fast is not None:
        return fast
    return 1.0 if any(equal(answer, gold) for gold in golds) else 0.0


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 if the last boxed answer in `response` equals `label`, else 0.0."""
    return decided(fast_path(response, label, metadata), last_boxed(response), gold_answers(label),
                   verify_with_math_verify)
