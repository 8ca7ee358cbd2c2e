"""`ifbench`: IFEval-style verifiable instruction following, driven by the row's metadata.

A row lists its instructions as `metadata["instruction_id_list"]` (IFEval ids) with an aligned
`metadata["kwargs"]` list of per-instruction parameter dicts (None / {} when there are none).
If the metadata has no instruction list, the label is used instead when it is a dict or a JSON
string holding the same two keys. Score = fraction of instructions followed, in [0, 1]; with
`metadata["strict"] = true` it is 1.0 only when all are followed, else 0.0.

Supported ids (a documented subset of IFEval, plus `startend:start_checker`):
  length_constraints:number_words      relation, num_words      (words = runs of \\w)
  length_constraints:number_sentences  relation, num_sentences  (split after . ! ?)
  keywords:existence                   keywords                 (each appears, any case)
  keywords:frequency                   keyword, frequency, relation
  keywords:forbidden_words             forbidden_words          (none appears as a word)
  punctuation:no_comma                 -
  change_case:english_lowercase        -                        (no upper-case letters)
  change_case:english_capital          -                        (no lower-case letters)
  detectable_format:json_format        -                        (``` fences allowed)
  detectable_format:number_bullet_lists num_bullets             (lines starting "* " or "- ")
  detectable_format:title              -                        (a <<title>> somewhere)
  startend:end_checker                 end_phrase               (last words, any case)
  startend:start_checker               start_phrase             (first words, any case)
  startend:quotation                   -                        (wrapped in double quotes)
`relation` is one of "less than", "at most", "exactly", "at least", "more than".
An unknown instruction id or relation raises ValueError.
"""

from __future__ import annotations

import json
import operator
import re
from typing import Any, Callable

RELATIONS: dict[str, Callable[[int, int], bool]] = {
    "less than": operator.lt,
    "at most": operator.le,
    "exactly": operator.eq,
    "at least": operator.ge,
    "more than": operator.gt,
}


def _compare(count: int, relation: str, target: Any) -> bool:
    if relation not in RELATIONS:
        raise ValueError(f"ifbench: unknown relation {relation!r}; use one of {sorted(RELATIONS)}")
    return RELATIONS[relation](count, int(target))


def _count_words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def _count_sentences(text: str) -> int:
    return len([part for part in re.split(r"(?<=[.!?])\s+", text.strip()) if part.strip()])


def _number_words(text: str, kw: dict) -> bool:
    return _compare(_count_words(text), kw["relation"], kw["num_words"])


def _number_sentences(text: str, kw: dict) -> bool:
    return _compare(_count_sentences(text), kw["relation"], kw["num_sentences"])


def _existence(text: str, kw: dict) -> bool:
    return all(re.search(re.escape(word), text, flags=re.IGNORECASE) for word in kw["keywords"])


def _frequency(text: str, kw: dict) -> bool:
    count = len(re.findall(re.escape(kw["keyword"]), text, flags=re.IGNORECASE))
    return _compare(count, kw["relation"], kw["frequency"])


def _forbidden(text: str, kw: dict) -> bool:
    return not any(re.search(rf"\b{re.escape(word)}\b", text, flags=re.IGNORECASE)
                   for word in kw["forbidden_words"])


def _json_format(text: str, kw: dict) -> bool:
    body = re.sub(r"^```(?:json|JSON|Json)?\s*|\s*```$", "", text.strip())
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _bullets(text: str, kw: dict) -> bool:
    bullets = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    bullets += re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(bullets) == int(kw["num_bullets"])


def _ends_with(text: str, kw: dict) -> bool:
    return text.strip().strip('"').lower().endswith(kw["end_phrase"].strip().lower())


def _starts_with(text: str, kw: dict) -> bool:
    return text.strip().strip('"').lower().startswith(kw["start_phrase"].strip().lower())


def _quotation(text: str, kw: dict) -> bool:
    text = text.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


CHECKS: dict[str, Callable[[str, dict], bool]] = {
    "length_constraints:number_words": _number_words,
    "length_constraints:number_sentences": _number_sentences,
    "keywords:existence": _existence,
    "keywords:frequency": _frequency,
    "keywords:forbidden_words": _forbidden,
    "punctuation:no_comma": lambda text, kw: "," not in text,
    "change_case:english_lowercase": lambda text, kw: text == text.lower(),
    "change_case:english_capital": lambda text, kw: text == text.upper(),
    "detectable_format:json_format": _json_format,
    "detectable_format:number_bullet_lists": _bullets,
    "detectable_format:title": lambda text, kw: re.search(r"<<[^\n]+>>", text) is not None,
    "startend:end_checker": _ends_with,
    "startend:start_checker": _starts_with,
    "startend:quotation": _quotation,
}


def instructions(label: Any, metadata: dict | None) -> tuple[list[str], list[dict]]:
    """(instruction ids, aligned kwargs dicts) from the metadata, or from a dict/JSON label."""
    source = metadata or {}
    if "instruction_id_list" not in source:
        source = json.loads(label) if isinstance(label, str) and label.strip().startswith("{") else label
    if not isinstance(source, dict) or "instruction_id_list" not in source:
        raise ValueError("ifbench: the row needs metadata['instruction_id_list'] (and 'kwargs'), "
                         "or a label dict / JSON string with those keys")
    ids = list(source["instruction_id_list"])
    kwargs = source.get("kwargs") or [{}] * len(ids)
    if len(kwargs) != len(ids):
        raise ValueError(f"ifbench: {len(ids)} instruction ids but {len(kwargs)} kwargs entries; align them")
    return ids, [kw or {} for kw in kwargs]


def follows(instruction_id: str, response: str, kwargs: dict) -> bool:
    """Whether `response` follows one instruction."""
    if instruction_id not in CHECKS:
        raise ValueError(f"ifbench: unknown instruction id {instruction_id!r}; supported: {sorted(CHECKS)}")
    try:
        return bool(CHECKS[instruction_id](response, kwargs))
    except KeyError as exc:
        raise ValueError(f"ifbench: instruction {instruction_id!r} needs kwargs key {exc}; got {kwargs}") from exc


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """Fraction of the row's instructions followed (all-or-nothing with metadata['strict'])."""
    ids, kwargs = instructions(label, metadata)
    if not ids:
        raise ValueError("ifbench: instruction_id_list is empty")
    followed = [follows(iid, response, kw) for iid, kw in zip(ids, kwargs)]
    if (metadata or {}).get("strict"):
        return float(all(followed))
    return sum(followed) / len(followed)
