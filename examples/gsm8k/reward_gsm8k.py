"""GSM8K answer checking, ported from verl's rule-based gsm8k scorer to a Relax reward function.

verl's `compute_score(data_source, solution_str, ground_truth, extra_info)` dispatches on
`data_source`; here the gsm8k rule stands alone and `reward_func(args, sample, **kwargs)` wraps it
for `--custom-rm-path examples.gsm8k.reward_gsm8k.reward_func --reward-key score`.

The rule: the prediction is the number after the last `####` in the response (GSM8K's answer
marker). When there is no `####` and the method is "flexible" (the default here; verl's default is
"strict"), it is the last number in the response instead. Commas, `$` and a trailing `.` are
removed; prediction and label are equal when their strings match or both parse to the same number
(`72.0` == `72`). Returns {"score": 1.0 / format_score / 0.0, "acc": bool, "pred": str | None}.

Options (set them in a `--custom-config-path` YAML; they arrive as `args.<key>`, the way verl's
`reward_kwargs` did): `gsm8k_method` ("flexible" or "strict"), `gsm8k_format_score` (score of a
response that has an answer but the wrong one; default 0.0), `gsm8k_correct_score` (default 1.0).
"""

from __future__ import annotations

import re
from typing import Any

from relax.utils.types import Sample

METHODS = ("flexible", "strict")
# Regexes on very long strings are slow and the answer sits at the end: look at the tail only.
SOLUTION_CLIP_CHARS = 300
# A number: optional sign and `$`, digits with optional thousands commas, optional decimals.
_NUMBER = r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + ")")
_NUMBER_RE = re.compile(_NUMBER)


def normalize_number(text: str) -> str:
    """Strip thousands separators, `$` and a trailing `.`: "$1,234." -> "1234"."""
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_answer(response: str, method: str = "flexible") -> str | None:
    """The normalised final answer of a response, or None when it has none (see module docstring)."""
    if method not in METHODS:
        raise ValueError(f"gsm8k method must be one of {METHODS}, got {method!r}; set gsm8k_method in the "
                         "--custom-config-path YAML")
    tail = response[-SOLUTION_CLIP_CHARS:]
    marked = _STRICT_RE.findall(tail)
    if marked:
        return normalize_number(marked[-1])
    if method == "strict":
        return None
    numbers = _NUMBER_RE.findall(tail)
    return normalize_number(numbers[-1]) if numbers else None


def answers_match(pred: str, label: str) -> bool:
    """Exact string match after normalisation, else numeric equality."""
    label = normalize_number(str(label))
    if pred == label:
        return True
    try:
        return float(pred) == float(label)
    except ValueError:
        return False


def compute_score(predict_str: str, ground_truth: str, extra_info: dict | None = None, *,
                  method: str = "flexible", format_score: float = 0.0, correct_score: float = 1.0) -> dict:
    """Score one response against the gsm8k label: {"score", "acc", "pred"}."""
    del extra_info  # kept for verl's signature; gsm8k scoring needs only the label
    pred = extract_answer(predict_str or "", method)
    if pred is None:
        return {"score": 0.0, "acc": False, "pred": None}
    acc = answers_match(pred, ground_truth)
    return {"score": float(correct_score if acc else format_score), "acc": acc, "pred": pred}


async def reward_func(args: Any, sample: Sample, **kwargs: Any) -> dict:
    """Relax entry point: score `sample.response` against `sample.label`."""
    return compute_score(
        sample.response, sample.label, extra_info=sample.metadata,
        method=getattr(args, "gsm8k_method", "flexible"),
        format_score=getattr(args, "gsm8k_format_score", 0.0),
        correct_score=getattr(args, "gsm8k_correct_score", 1.0),
    )
