"""`dapo`: DAPO's "Answer: ..." rule (the Minerva-style check of DAPO-Math-17k).

Only the last 300 characters of the response count. The prediction is the text after the last
`Answer:` (case-insensitive) up to the end of that line; none -> "[INVALID]". Prediction and
label are normalised by `normalise_final_answer` and compared as strings.
Returns `{"score": 1.0 or -1.0, "acc": bool, "pred": str}` (use `--reward-key score`).
"""

from __future__ import annotations

import re
from typing import Any

from relax.engine.rewards.extract import last_boxed

TAIL_CHARS = 300
INVALID = "[INVALID]"

# (old, new) spellings that never change an answer's meaning.
_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
                  ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
# Units and filler words removed outright.
_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
            "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm",
            "gm", "pounds", "meters", "meals", "edges", "students", "childrentickets",
            "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
            "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!",
            "{,}", '"', "\\dots")


def normalise_final_answer(answer: str) -> str:
    """Canonical form of a final answer: last `=` side, no units, unwrapped `$`, boxes, text."""
    answer = answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for token in _REMOVED:
        answer = answer.replace(token, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", r"\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", r"\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", r"\2", answer)
    boxed = last_boxed(answer)
    if boxed is not None:
        answer = boxed
    answer = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", answer)  # \fracab -> \frac{a}{b}
    answer = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", answer)  # \sqrta -> \sqrt{a}
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def extract_answer(response: str) -> str:
    """The normalised text after the last `Answer:` in the last 300 characters, or "[INVALID]"."""
    matches = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", response[-TAIL_CHARS:])
    return normalise_final_answer(matches[-1]) if matches else INVALID


def score(response: str, label: Any, metadata: dict | None = None) -> dict[str, Any]:
    """`{"score": 1.0, "acc": True, "pred": ...}` when the answer matches the label, else score -1.0."""
    if label is None:
        raise ValueError("dapo: label is None; every row needs a label (see --label-key)")
    pred = extract_answer(response)
    correct = pred != INVALID and pred == normalise_final_answer(str(label))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
