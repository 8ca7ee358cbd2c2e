"""What a flag's declaration says about this build: `opt(supported=False)` flags are accepted
for compatibility with Relax/slime scripts but not built, so setting one is an error
(`check_unsupported`); `opt(ignored=...)` flags are accepted and have no effect here, so
setting one is noted with the reason (`ignored_flag_notes`: the run logs the notes, `--dry-run`
prints them with the plan).
"""

from __future__ import annotations

import dataclasses
import difflib

from relax.config.errors import ConfigError
from relax.config.fields import field_default, flag_for, flag_name
from relax.config.megatron_arch import MEGATRON_NO_EFFECT
from relax.config.schema import GROUPS, MEGATRON_ONLY, RelaxConfig


def check_unsupported(cfg: RelaxConfig) -> None:
    """A flag declared not built (`opt(supported=False)`) fails when set to anything but its default."""
    for group_name, cls in GROUPS.items():
        group = getattr(cfg, group_name)
        for f in dataclasses.fields(cls):
            if f.metadata.get("supported", True):
                continue
            if getattr(group, f.name) != field_default(f):
                raise ConfigError(
                    f"{flag_for(f.name)} is accepted for compatibility with Relax/slime scripts but is not implemented "
                    f"in this build yet; remove it (see docs/configuration.md for what each flag does here)"
                )


def ignored_flag_notes(cfg: RelaxConfig) -> list[str]:
    """One note per reason for the flags set to a non-default value that this build accepts
    without effect (`opt(ignored=...)`): the run logs them, `--dry-run` prints them."""
    by_reason: dict[str, list[str]] = {}
    for group_name, cls in GROUPS.items():
        group = getattr(cfg, group_name)
        for f in dataclasses.fields(cls):
            reason = f.metadata.get("ignored")
            if reason == MEGATRON_ONLY and cfg.cluster.train_backend == "megatron":
                if f.name not in MEGATRON_NO_EFFECT:
                    continue  # check_megatron: each acts or is an error
                reason = MEGATRON_NO_EFFECT[f.name]
            if reason and getattr(group, f.name) != field_default(f):
                by_reason.setdefault(reason, []).append(flag_for(f.name))
    return [f"{' '.join(flags)}: accepted and ignored: {reason}" for reason, flags in by_reason.items()]


def known_flags() -> list[str]:
    """Every flag the parser knows (for did-you-mean)."""
    return [flag_name(f) for cls in GROUPS.values() for f in dataclasses.fields(cls)]


def check_unknown_flags(cfg: RelaxConfig) -> None:
    """Flags the parser does not know fail first, each with its closest known flag (a typo is the
    usual cause). No backend reads flags beyond the schema's (the megatron backend reads the
    Megatron flags listed there, docs/backends/megatron.md), so no hint points to another one."""
    if not cfg.megatron_extra:
        return
    known = known_flags()
    named = ", ".join(flag + (f" (did you mean {close[0]}?)" if (close := difflib.get_close_matches(
        flag, known, n=1, cutoff=0.85)) else "") for flag in cfg.megatron_extra)
    raise ConfigError(f"unknown flag(s) {named}: not Relax flags, and no training backend reads other flags "
                      "(relax-train --help-all lists every flag; SGLang options are spelled --sglang-<option>)")
