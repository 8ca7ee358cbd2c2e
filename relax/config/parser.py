"""Flat CLI flags <-> typed config groups.

`build_parser()` derives every flag from the dataclass fields in `schema.GROUPS`;
`parse_flags(argv)` turns a command line (and the `--custom-config-path` YAML it names) into a
`RelaxConfig`, each value coerced to its field's type; the cross-flag checks and derived values are
`relax.config.checks`, and `relax.config.load.parse_config` runs both. Options the parser does
not know are kept when they are `--sglang-<option>` (SGLang ServerArgs passthrough); any other
is recorded (`RelaxConfig.megatron_extra`) and rejected first by the checks with the closest
known flag (`checks.flags.check_unknown_flags`). Every boolean takes `--flag`, `--flag true` and
`--flag false`; `--help` is grouped (`relax.config.help`).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Sequence

from relax.config.errors import ConfigError
from relax.config.fields import base_type, choices_of, coerce, field_default, flag_name
from relax.config.help import USAGE, HelpAction, HelpAllAction, group_title
from relax.config.schema import FIELD_GROUP, GROUPS, RelaxConfig


def _cli_type(f: dataclasses.Field, hint: Any) -> Any:
    """argparse `type=`: the shared coercion (`fields.coerce`), its message shown as argparse's error.
    For list flags argparse calls it once per item."""
    listed = bool(f.metadata.get("nargs"))

    def parse(text: str) -> Any:
        try:
            value = coerce(f, hint, [text] if listed else text)
        except ValueError as exc:  # FlagValueError, or a flag parser's own (bool, json, bytes)
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value[0] if listed else value

    parse.__name__ = getattr(f.metadata.get("type"), "__name__", None) or getattr(base_type(hint), "__name__", "value")
    return parse


def _add_field(group: argparse._ArgumentGroup, f: dataclasses.Field, hints: dict[str, Any]) -> None:
    meta, hint = f.metadata, hints[f.name]
    names = [flag_name(f), *meta.get("aliases", ())]
    default = field_default(f)
    help_text = meta.get("help", "")
    if not meta.get("supported", True):
        help_text += " [accepted for compatibility; not implemented in this build]"
    if base_type(hint) is bool:
        # One style for every boolean, as the seeds' scripts write them: `--flag`, `--flag true`,
        # `--flag false`; `bool | None` (None: decided by the mode) also takes --no-<flag>.
        group.add_argument(*names, dest=f.name, nargs="?", const=True, default=default, type=_cli_type(f, hint),
                           metavar="true|false", help=f"{help_text} (default: {default!r})")
        if default is None:
            group.add_argument("--no-" + names[0][2:], dest=f.name, action="store_const", const=False,
                               help=f"same as {names[0]} false")
        return
    kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": f"{help_text} (default: {default!r})",
                              "type": _cli_type(f, hint)}
    if choices_of(hint):
        kwargs["metavar"] = "{" + ",".join(choices_of(hint)) + "}"
    if meta.get("nargs"):
        kwargs["nargs"] = meta["nargs"]
    group.add_argument(*names, **kwargs)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line naming the flag, not the 300-flag usage
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help or docs/configuration.md)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="relax-train", usage=USAGE,
        description="Relax: asynchronous RL post-training. Flags follow docs/configuration.md; "
        "SGLang server options pass through as --sglang-<option>.",
        allow_abbrev=False, add_help=False,
    )
    parser.add_argument("-h", "--help", action=HelpAction)
    parser.add_argument("--help-all", action=HelpAllAction)
    for group_name, cls in GROUPS.items():
        group = parser.add_argument_group(group_name, group_title(group_name))
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
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except FileNotFoundError as exc:
        raise ConfigError(f"--custom-config-path: file not found: {path}") from exc
    except (YAMLError, OmegaConfBaseException) as exc:
        raise ConfigError(f"--custom-config-path {path}: not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"--custom-config-path {path}: expected a mapping of key: value, got {type(loaded).__name__}")
    return {str(k): v for k, v in loaded.items()}


def config_from_namespace(ns: argparse.Namespace, sglang: dict[str, Any] | None = None,
                          megatron_extra: list[str] | None = None) -> RelaxConfig:
    values = vars(ns)
    groups = {name: cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)}) for name, cls in GROUPS.items()}
    return RelaxConfig(**groups, sglang=dict(sglang or {}), megatron_extra=list(megatron_extra or []))


def apply_custom(cfg: RelaxConfig, custom: dict[str, Any], path: str) -> RelaxConfig:
    """YAML keys that name a flag override it, coerced and checked exactly as on the command line
    (the error names the key, the file and what was expected); the others become extra
    `args.<key>` for plugins."""
    known: dict[str, Any] = {}
    for key, value in custom.items():
        if key not in FIELD_GROUP:
            continue
        cls = GROUPS[FIELD_GROUP[key]]
        f = next(f for f in dataclasses.fields(cls) if f.name == key)
        try:
            known[key] = coerce(f, typing.get_type_hints(cls)[key], value)
        except ValueError as exc:  # FlagValueError, or a flag parser's own (bool, json, bytes)
            raise ConfigError(f"--custom-config-path {path}: {key}: {exc} (the same value as {flag_name(f)} on the "
                              "command line; fix the value in the file)") from None
    extra = {k: v for k, v in custom.items() if k not in FIELD_GROUP}
    return dataclasses.replace(cfg.replace(**known), custom={**cfg.custom, **extra})


def parse_flags(argv: Sequence[str] | None = None) -> RelaxConfig:
    """The command line (`sys.argv[1:]` when None) as a config, `--custom-config-path` merged in;
    not yet checked across flags (`relax.config.checks.check_config`)."""
    parser = build_parser()
    ns, unknown = parser.parse_known_args(argv)
    sglang, extra = _split_unknown(unknown)
    cfg = config_from_namespace(ns, sglang, extra)
    if cfg.misc.custom_config_path:
        cfg = apply_custom(cfg, _load_custom_yaml(cfg.misc.custom_config_path), cfg.misc.custom_config_path)
    return cfg
