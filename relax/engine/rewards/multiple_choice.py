"""`multiple_choice`: the content of the response's `<answer>...</answer>` against the label.

The last complete `<answer>` block is taken (none -> 0.0). If both the answer and the label
read as a single choice letter (`B`, `(b)`, `B.`, `B) Paris`, or a label stored as
`<answer>B</answer>`) the letters are compared case-insensitively; otherwise the two texts are
compared case-insensitively after collapsing whitespace. Returns 1.0 or 0.0.
"""

from __future__ import annotations

import re
from typing import Any

from relax.engine.rewards.extract import tag_blocks, unwrap_tag

_LEADING_LETTER = r"^\(?([A-Za-z])\)?(?:[.):]|\s|$)"


def choice_letter(text: str) -> str | None:
    """The choice letter `text` starts with (upper case), or None."""
    text = text.strip()
    match = re.match(_LEADING_LETTER, text)
    return match.group(1).upper() if match else None


def _plain(text: str) -> str:
    return " ".join(text.split()).lower()


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 if the `<answer>` content matches the label, else 0.0."""
    if label is None:
        raise ValueError("multiple_choice: label is None; every row needs a label (see --label-key)")
    blocks = tag_blocks(response, "answer")
    if not blocks:
        return 0.0
    answer, gold = blocks[-1].strip(), unwrap_tag(str(label), "answer")
    answer_letter, gold_letter = choice_letter(answer), choice_letter(gold)
    if answer_letter and gold_letter and len(gold.strip("().: ")) == 1:
        return 1.0 if answer_letter == gold_letter else 0.0
    return 1.0 if _plain(answer) == _plain(gold) else 0.0
