"""`deepscaler`: DeepScaleR's rule — only the text after the last `</think>` is graded.

No `</think>` in the response -> 0.0 (an unfinished thought is not an answer). Otherwise the
text after it is scored exactly as `math` does (last `\\boxed{}`, fast path, math-verify).
"""

from __future__ import annotations

from typing import Any

from relax.engine.rewards import math_rm

THINK_END = "</think>"


def _final_text(response: str) -> str | None:
    if THINK_END not in response:
        return None
    return response.rsplit(THINK_END, 1)[1]


def fast_path(response: str, label: Any, metadata: dict | None = None) -> float | None:
    """0.0 without `</think>`; otherwise `math`'s fast path on the text after it."""
    final = _final_text(response)
    return 0.0 if final is None else math_rm.fast_path(final, label, metadata)


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 if the boxed answer after `</think>` equals `label`, else 0.0."""
    final = _final_text(response)
    return 0.0 if final is None else math_rm.score(final, label, metadata)
