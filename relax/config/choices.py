"""Named choices checked when the flags are parsed, and the did-you-mean behind every "unknown
name" message.

Most choices are `Literal` annotations in the schema (estimators, backends, KL types), which the
parser checks itself. A few are registries that live outside the config package (the built-in
reward types of `relax.engine.rewards.registry`): config imports no engine, so their names are
listed here and a unit test keeps the two lists equal (tests/unit/config/test_choices.py). A bad
name then fails at parse time, listing the valid ones, instead of after Ray started.
"""

from __future__ import annotations

import difflib
from typing import Iterable

# relax.engine.rewards.registry.REWARD_TYPES (names only; the test compares them).
REWARD_TYPES = ("dapo", "deepscaler", "f1", "genrm", "gpqa", "ifbench", "math", "multiple_choice", "openr1mm",
                "remote_rm")
ASYNC_REWARD_TYPES = ("genrm", "remote_rm")  # `boxed_<type>` applies to the sync ones only
BOXED_PREFIX = "boxed_"


def suggest(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """"; did you mean X?" for the option closest to `word` (difflib), or "" when none is close."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]}?" if close else ""


def reward_type_names() -> list[str]:
    """Every valid --rm-type, as the error lists them."""
    return [*REWARD_TYPES, f"{BOXED_PREFIX}<type> (sync types)"]


def parse_rm_type(text: str) -> str:
    """argparse/YAML `type=` of --rm-type: a built-in reward type or `boxed_<sync type>`."""
    inner = text[len(BOXED_PREFIX):] if text.startswith(BOXED_PREFIX) else None
    if text in REWARD_TYPES or (inner in REWARD_TYPES and inner not in ASYNC_REWARD_TYPES):
        return text
    if inner in ASYNC_REWARD_TYPES:
        raise ValueError(f"{text!r}: the {BOXED_PREFIX} prefix applies to sync reward types only, not {inner}")
    boxed = [f"{BOXED_PREFIX}{t}" for t in REWARD_TYPES if t not in ASYNC_REWARD_TYPES]
    raise ValueError(f"unknown reward type {text!r} (choose from {', '.join(reward_type_names())})"
                     f"{suggest(text, [*REWARD_TYPES, *boxed])}")


parse_rm_type.__name__ = "reward type"
