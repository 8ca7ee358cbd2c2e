"""`gpqa`: the choice letter the response commits to, against the correct letter.

The predicted letter is the LAST match of any of these phrasings (letters A-J; the letter must
be upper case unless it is inside parentheses or a box, so "the answer is a function" never
reads as choice A):
  `\\boxed{B}` / `\\boxed{(B)}` / `\\boxed{\\text{B}}`, `<answer>B</answer>`,
  `answer is (B)` / `answer is: **B**` / `Answer: B` / `answer: (b)` / `correct option is B`,
  and, when nothing else matched, a response that is only a letter (`B`, `(B)`, `B.`).
The correct letter is `metadata["correct_letter"]` (also read: `metadata["answer_letter"]`,
`metadata["correct_answer"]` when it is a letter); else the label when it is a letter
(optionally `(B)` or `<answer>B</answer>`); else, when `metadata["choices"]` lists the options
and the label is one of them, the letter at its position. Returns 1.0 or 0.0.
"""

from __future__ import annotations

import re
import string
from typing import Any

from relax.engine.rewards.extract import unwrap_tag

LETTERS = "ABCDEFGHIJ"
_L = f"[{LETTERS}]"
_L_ANY_CASE = f"[{LETTERS}{LETTERS.lower()}]"
_PATTERNS = (
    rf"\\boxed\{{\s*(?:\\text\{{)?\(?({_L_ANY_CASE})\)?\}}?\s*\}}",
    rf"<answer>\s*\(?({_L_ANY_CASE})\)?[.)]?\s*</answer>",
    rf"(?i:answer|option|choice)\s*(?i:is)?\s*:?\s*\**\s*\(({_L_ANY_CASE})\)",
    rf"(?i:answer|option|choice)\s*(?i:is)?\s*:?\s*\**\s*({_L})(?![A-Za-z])",
)
_LETTER_ONLY = rf"^\s*\**\(?({_L})\)?\.?\**\s*$"
_METADATA_KEYS = ("correct_letter", "answer_letter", "correct_answer")


def extract_letter(response: str) -> str | None:
    """The last choice letter the response commits to (upper case), or None."""
    best: tuple[int, str] | None = None
    for pattern in _PATTERNS:
        for match in re.finditer(pattern, response):
            if best is None or match.start() > best[0]:
                best = (match.start(), match.group(1).upper())
    if best is not None:
        return best[1]
    match = re.match(_LETTER_ONLY, response)
    return match.group(1) if match else None


def _as_letter(value: Any) -> str | None:
    text = unwrap_tag(str(value), "answer").strip().strip("()").strip().rstrip(".")
    return text.upper() if len(text) == 1 and text.upper() in LETTERS else None


def gold_letter(label: Any, metadata: dict | None) -> str:
    """The correct letter from metadata or the label (rules in the module docstring)."""
    metadata = metadata or {}
    for key in _METADATA_KEYS:
        if key in metadata and _as_letter(metadata[key]):
            return _as_letter(metadata[key])
    if label is not None and _as_letter(label):
        return _as_letter(label)
    choices = metadata.get("choices")
    if isinstance(choices, list) and label in choices:
        return string.ascii_uppercase[choices.index(label)]
    raise ValueError(
        f"gpqa: cannot find the correct letter: label {label!r} is not a letter and metadata has no "
        f"{'/'.join(_METADATA_KEYS)} key (or 'choices' containing the label)"
    )


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 if the response's choice letter is the correct one, else 0.0."""
    gold = gold_letter(label, metadata)
    return 1.0 if extract_letter(response) == gold else 0.0
