"""`openr1mm`: open-r1-multimodal accuracy — the `<answer>` content through math-verify.

Format gate (any failure -> 0.0): exactly one `<answer>` and one `</answer>`, in that order;
at most one `<think>` and `</think>`, balanced, and the think block (if any) closes before
`<answer>` opens. Then the answer (and the label, which may itself be wrapped in
`<answer>...</answer>`) are compared: equal after `math` normalisation -> 1.0 (fast path);
else math-verify -> 1.0 / 0.0; if math-verify cannot parse either side, a case-insensitive
string comparison decides (as open-r1-multimodal does). A list label means any of them.
"""

from __future__ import annotations

from typing import Any

from relax.engine.rewards import math_rm
from relax.engine.rewards.extract import unwrap_tag


def answer_if_well_formed(response: str) -> str | None:
    """The single `<answer>` content when the response passes the format gate, else None."""
    counts = {tag: response.count(tag) for tag in ("<answer>", "</answer>", "<think>", "</think>")}
    if counts["<answer>"] != 1 or counts["</answer>"] != 1:
        return None
    if counts["<think>"] > 1 or counts["<think>"] != counts["</think>"]:
        return None
    open_at, close_at = response.index("<answer>"), response.index("</answer>")
    if close_at < open_at:
        return None
    if counts["<think>"] and not response.index("<think>") < response.index("</think>") < open_at:
        return None
    return response[open_at + len("<answer>"):close_at].strip()


def _golds(label: Any) -> list[str]:
    items = label if isinstance(label, (list, tuple)) else [label]
    return [unwrap_tag(gold, "answer") for gold in math_rm.gold_answers(items)]


def fast_path(response: str, label: Any, metadata: dict | None = None) -> float | None:
    """0.0 on a broken format, 1.0 on a normalised exact match, None when math-verify is needed."""
    answer = answer_if_well_formed(response)
    if answer is None:
        return 0.0
    answer = math_rm.normalise(answer)
    return 1.0 if any(answer == math_rm.normalise(gold) for gold in _golds(label)) else None


def _equal(answer: str, gold: str) -> bool:
    verdict = math_rm.math_verify_equal(answer, gold)
    return answer.strip().lower() == gold.strip().lower() if verdict is None else verdict


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 if the single well-formed `<answer>` equals the label, else 0.0."""
    return math_rm.decided(fast_path(response, label, metadata), answer_if_well_formed(response), _golds(label),
                           _equal)
