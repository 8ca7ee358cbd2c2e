"""What a flag's declaration says about this build: `opt(supported=False)` flags are accepted
for compatibility with Relax/slime scripts but not built, so setting one is an error
(`check_unsupported`); `opt(ignored=...)` flags are accepted and have no effect here, so
setting one is noted with the reason (`ignored_flag_notes`: the run logs the notes, `--dry-run`
prints them with the plan).
"""

from __future__ import annotations

import dataclasses

from relax.config.errors import ConfigError
from relax.config.fields import field_default, flag_for
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
                continue  # check_megatron: each acts or is an error
            if reason and getattr(group, f.name) != field_default(f):
                by_reason.setdefault(reason, []).append(flag_for(f.name))
    return [f"{' '.join(flags)}: accepted and ignored: {reason}" for reason, flags in by_reason.items()]
