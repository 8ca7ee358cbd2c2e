"""`f1`: token-level F1 between the response and the label, SQuAD-style.

Both sides are normalised (lower case, punctuation removed, the articles a/an/the removed,
whitespace collapsed) and split on whitespace; F1 = 2PR/(P+R) over the multiset of shared
tokens. If either side has no tokens the score is 1.0 when both are empty, else 0.0.
A list label scores the maximum over its entries. Returns a float in [0, 1].
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

_PUNCTUATION = set(string.punctuation)


def normalise(text: str) -> str:
    """SQuAD answer normalisation."""
    text = "".join(char for char in str(text).lower() if char not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """Token F1 of two strings after `normalise`."""
    pred_tokens, gold_tokens = normalise(prediction).split(), normalise(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    shared = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(pred_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """Max token F1 of `response` over the label(s)."""
    golds = label if isinstance(label, (list, tuple)) else [label]
    if not golds or any(gold is None for gold in golds):
        raise ValueError(f"f1: label must be a string or a non-empty list of strings, got {label!r}")
    return max(token_f1(response, str(gold)) for gold in golds)
