"""A run's config from its command line: the flags parsed (`relax.config.parser`), then checked
across flags with their derived values filled in (`relax.config.checks`).

Above both so that neither imports the other: the parser knows nothing of the checks, and the
checks take a parsed `RelaxConfig`. `parse_config` is what `relax-train` and the tests call.
"""

from __future__ import annotations

from typing import Sequence

from relax.config.checks import EngineCheck, check_config
from relax.config.parser import parse_flags
from relax.config.schema import RelaxConfig


def parse_config(argv: Sequence[str] | None = None, *, validate: bool = True,
                 engine_check: EngineCheck | None = None) -> RelaxConfig:
    """The config of `argv` (`sys.argv[1:]` when None); with `validate`, checked and derived
    (`check_config`; `engine_check` judges the inference engines' options, see there)."""
    cfg = parse_flags(argv)
    return check_config(cfg, engine_check) if validate else cfg
