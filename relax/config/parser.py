"""Flat CLI flags <-> typed config groups.

`build_parser()` derives every flag from the dataclass fields in `schema.GROUPS`;
`parse_config(argv)` returns a validated `RelaxConfig`. Options the parser does not know are
kept when they are `--sglang-<option>` (SGLang ServerArgs passthrough) and otherwise recorded
as Megatron flags, which only the megatron backend accepts (validation rejects them with fsdp).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Sequence

from relax.config.fields import flag_name
from relax.config.schema import GROUPS, RelaxConfig


class ConfigError(ValueError):
    """A bad flag value or combination; the message names the flags and the fix."""


def _base_type(hint: Any) -> Any:
    """`int | None` -> int; other unions and containers -> themselves."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and typing.get_origin(hint) in (typing.Union, types.UnionType) else hint


def _scalar_type(hint: Any) -> Any:
    base = _base_type(hint)
    return base if base in (int, float, str) else str


def _add_field(group: argparse._ArgumentGroup, f: dataclasses.Field, hints: dict[str, Any]) -> None:
    meta = f.metadata
    names = [flag_name(f), *meta.get("aliases", ())]
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    help_text = meta.get("help", "")
    if not meta.get("supported", True):
        help_text += " [accepted for compatibility; not implemented in this build]"
    if _base_type(hints[f.name]) is bool and meta.get("type") is None:
        group.add_argument(*names, dest=f.name, action="store_true", default=default, help=help_text)
        return
    kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": f"{help_text} (default: {default!r})"}
    if meta.get("choices"):
        kwargs["choices"] = meta["choices"]
    if meta.get("nargs"):
        kwargs["nargs"] = meta["nargs"]
    kwargs["type"] = meta.get("type") or (str if meta.get("nargs") else _scalar_type(hints[f.name]))
    group.add_argument(*names, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relax-train",
        description="Relax: asynchronous RL post-training. Flags follow docs/configuration.md; "
        "SGLang server options pass through as --sglang-<option>.",
        allow_abbrev=False,
    )
    for group_name, cls in GROUPS.items():
        group = parser.add_argument_group(group_name, (cls.__doc__ or "").strip().split("\n")[0] or None)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            _add_field(group, f, hints)
    return parser


def _split_unknown(unknown: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`--sglang-mem-fraction-static 0.8` -> {"mem_fraction_static": "0.8"}; the rest is Megatron's."""
    sglang: dict[str, Any] = {}
    extra: list[str] = []
    i = 0
    while i < len(unknown):
        token = unknown[i]
        value: Any = True
        key = token
        if "=" in token:
            key, value = token.split("=", 1)
        elif i + 1 < len(unknown) and not unknown[i + 1].startswith("--"):
            value = unknown[i + 1]
            i += 1
        if key.startswith("--sglang-"):
            sglang[key[len("--sglang-"):].replace("-", "_")] = value
        elif key.startswith("--"):
            extra.append(key)
        else:
            raise ConfigError(f"unexpected argument {token!r}: every option is a --flag (see relax-train --help)")
        i += 1
    return sglang, extra


def _load_custom_yaml(path: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except FileNotFoundError as exc:
        raise ConfigError(f"--custom-config-path: file not found: {path}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"--custom-config-path {path}: expected a mapping of key: value, got {type(loaded).__name__}")
    return {str(k): v for k, v in loaded.items()}


def config_from_namespace(ns: argparse.Namespace, sglang: dict[str, Any] | None = None,
                          megatron_extra: list[str] | None = None) -> RelaxConfig:
    values = vars(ns)
    groups = {name: cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)}) for name, cls in GROUPS.items()}
    return RelaxConfig(**groups, sglang=dict(sglang or {}), megatron_extra=list(megatron_extra or []))


def _apply_custom(cfg: RelaxConfig, custom: dict[str, Any]) -> None:
    """YAML keys that name a known flag override it; the others become extra `args.<key>`."""
    owners = {f.name: name for name, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    for key, value in custom.items():
        if key in owners:
            setattr(getattr(cfg, owners[key]), key, value)
        else:
            cfg.custom[key] = value


def parse_config(argv: Sequence[str] | None = None, *, validate: bool = True) -> RelaxConfig:
    parser = build_parser()
    ns, unknown = parser.parse_known_args(argv)
    sglang, extra = _split_unknown(unknown)
    cfg = config_from_namespace(ns, sglang, extra)
    if cfg.misc.custom_config_path:
        _apply_custom(cfg, _load_custom_yaml(cfg.misc.custom_config_path))
    if validate:
        from relax.config.validate import validate_config

        validate_config(cfg)
    return cfg
