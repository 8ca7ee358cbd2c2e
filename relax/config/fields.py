"""How a dataclass field becomes a CLI flag.

Each config group is a plain dataclass; `opt(...)` attaches the flag's help text and parsing
hints as field metadata. The flag name is the field name with `-` for `_` (the seed's names),
unless `flag=` overrides it. No torch/ray import here: `--help` must stay instant.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

_MISSING = dataclasses.MISSING


def opt(default: Any = None, help: str = "", *, type: Callable[[str], Any] | None = None,
        choices: tuple[Any, ...] | None = None, nargs: str | None = None, flag: str | None = None,
        aliases: tuple[str, ...] = (), supported: bool = True, default_factory: Any = _MISSING) -> Any:
    """A config field. `supported=False` marks a seed flag accepted for compatibility whose
    feature this build does not implement yet: setting it to a non-default value is an error."""
    meta = {"help": help, "type": type, "choices": choices, "nargs": nargs, "flag": flag,
            "aliases": aliases, "supported": supported}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_name(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def parse_json(text: str) -> Any:
    """argparse `type=` for JSON-valued flags (`--resource`, `--multimodal-keys`, ...)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos}): {text!r}") from exc


parse_json.__name__ = "json"


def parse_bytes(text: str) -> int:
    """Byte sizes: a plain integer or one with a KB/MB/GB (powers of 1024) suffix, e.g. 512MB."""
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = text.strip().upper().replace("IB", "B")
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(suffix):
            return int(float(s[: -len(suffix)]) * mult)
    return int(s)


parse_bytes.__name__ = "bytes"


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected true/false, got {text!r}")


parse_bool.__name__ = "bool"
