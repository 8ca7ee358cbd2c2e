"""Answer extraction shared by the built-in rewards: `\\boxed{...}`, `<tag>...</tag>`, labels.

All functions are pure string code (no math-verify), so they are cheap enough to run inline
in the reward executor's event loop.
"""

from __future__ import annotations

import re
from typing import Any

_BOXED_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` in `text` (balanced braces), else None.

    Also accepts the brace-less form `\\boxed 5` (content up to the next `$` or whitespace).
    An unclosed `\\boxed{` yields None.
    """
    start = max(text.rfind(cmd) for cmd in _BOXED_COMMANDS)
    if start < 0:
        return None
    command = next(cmd for cmd in _BOXED_COMMANDS if text.startswith(cmd, start))
    rest = text[start + len(command):]
    if rest.startswith(" "):
        match = re.match(r"\s+([^\s$]+)", rest)
        return match.group(1) if match else None
    if not rest.startswith("{"):
        return None
    return _balanced_brace_content(rest)


def _balanced_brace_content(text: str) -> str | None:
    """`text` starts with `{`: the content up to its matching `}`, or None if unbalanced."""
    depth = 0
    for i, char in enumerate(text):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[1:i]
    return None


def tag_blocks(text: str, tag: str) -> list[str]:
    """Contents of every complete `<tag>...</tag>` block in `text` (non-greedy, dotall)."""
    return re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)


def unwrap_tag(text: str, tag: str) -> str:
    """`text` without one surrounding `<tag>...</tag>` (labels are sometimes stored wrapped)."""
    blocks = tag_blocks(text, tag)
    return blocks[-1].strip() if blocks else text.strip()


def label_text(label: Any) -> str:
    """A scalar label as a string: numbers via `str`, `\\boxed{x}` labels unwrapped to `x`."""
    if label is None:
        raise ValueError("label is None; every row needs a label for rule-based rewards (see --label-key)")
    text = str(label).strip()
    boxed = last_boxed(text)
    return boxed.strip() if boxed is not None else text
