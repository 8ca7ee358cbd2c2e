"""How a dataclass field becomes a CLI flag.

Each config group is a plain dataclass; `opt(...)` attaches the flag's help text and parsing
hints as field metadata. The flag name is the field name with `-` for `_` (the seed's names),
unless `flag=` overrides it. No torch/ray import here: `--help` must stay instant.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Callable, Literal

from relax.config.choices import suggest

_MISSING = dataclasses.MISSING


def opt(default: Any = None, help: str = "", *, type: Callable[[str], Any] | None = None,
        nargs: str | None = None, flag: str | None = None, aliases: tuple[str, ...] = (),
        supported: bool = True, ignored: str | None = None, default_factory: Any = _MISSING) -> Any:
    """A config field. Its choices come from a `Literal[...]` annotation.

    Every flag acts, or says why not: `supported=False` marks a seed flag accepted for
    compatibility whose feature this build does not implement yet (setting it to a non-default
    value is an error); `ignored="<why>"` marks one that is accepted and has no effect in this
    build for that reason (setting it logs the reason at start and `--dry-run` prints it)."""
    meta = {"help": help, "type": type, "nargs": nargs, "flag": flag, "aliases": aliases, "supported": supported,
            "ignored": ignored}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_name(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or flag_for(field.name)


def flag_for(name: str) -> str:
    """The command-line spelling of a config field's name (`num_layers` -> `--num-layers`)."""
    return "--" + name.replace("_", "-")


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


# ---- one coercion for the command line and YAML ------------------------------------------


class FlagValueError(ValueError):
    """A value that does not fit its flag's type or choices; the message names what was expected."""


def field_default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not _MISSING else f.default_factory()  # type: ignore[misc]


def _union_args(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def optional(hint: Any) -> bool:
    """The annotation admits None (`int | None`)."""
    return type(None) in _union_args(hint)


def base_type(hint: Any) -> Any:
    """`int | None` -> int; `Literal[...]` stays itself; other unions -> Any."""
    args = [a for a in _union_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else Any


def choices_of(hint: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` annotation (None: any value of the type)."""
    base = base_type(hint)
    return typing.get_args(base) if typing.get_origin(base) is Literal else None


def _scalar(kind: Any, value: Any, parse: Callable[[str], Any] | None) -> Any:
    """`value` as `kind` (str from the command line, or a YAML scalar); FlagValueError otherwise."""
    if parse is not None:
        if isinstance(value, str):
            return parse(value)
        expected = {"json": (dict, list), "bytes": (int,), "bool": (bool,)}.get(parse.__name__, ())
        if isinstance(value, expected) and not (parse.__name__ == "bytes" and isinstance(value, bool)):
            return value
        raise FlagValueError(f"expected a {parse.__name__} value, got {type(value).__name__} {value!r}")
    if kind is bool:
        return value if isinstance(value, bool) else parse_bool(value) if isinstance(value, str) else _bad(kind, value)
    if kind is int:
        if isinstance(value, str):
            return _number(int, value)
        return value if isinstance(value, int) and not isinstance(value, bool) else _bad(kind, value)
    if kind is float:
        if isinstance(value, str):
            return _number(float, value)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _bad(kind, value)
    if kind is str or typing.get_origin(kind) is Literal:
        return value if isinstance(value, str) else _bad(str, value)
    return value  # Any: taken as given (e.g. --prompt-data: a path or a list of paths)


def _number(kind: type, text: str) -> Any:
    try:
        return kind(text.strip())
    except ValueError:
        raise FlagValueError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def _bad(kind: Any, value: Any) -> Any:
    name = getattr(kind, "__name__", str(kind))
    raise FlagValueError(f"expected {name}, got {type(value).__name__} {value!r}")


def coerce(f: dataclasses.Field, hint: Any, value: Any) -> Any:
    """The value of field `f` (annotation `hint`) from a command-line string or a YAML value.

    The command line and `--custom-config-path` both come through here, so a flag has one
    meaning whatever its source: the same parsing (`"4"` -> 4, `"512MB"` -> bytes, JSON text
    -> a dict), the same type check and the same choices."""
    meta = f.metadata
    if value is None:
        if optional(hint) or field_default(f) is None:
            return None
        raise FlagValueError("expected a value, got null")
    kind, parse = base_type(hint), meta.get("type")
    if meta.get("nargs"):  # a list; `type=` is the type of its items
        kind, parse = (parse or str, None) if parse in (None, int, float, str) else (Any, parse)
        items = value if isinstance(value, (list, tuple)) else [value]
        return [_scalar(kind, v, parse) for v in items]
    return _checked(_scalar(kind, value, parse), choices_of(hint))


def _checked(value: Any, choices: tuple[Any, ...] | None) -> Any:
    if choices is not None and value not in choices:
        raise FlagValueError(f"invalid choice {value!r} (choose from {', '.join(map(str, choices))})"
                             f"{suggest(str(value), map(str, choices))}")
    return value
