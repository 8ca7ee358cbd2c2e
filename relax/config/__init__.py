"""Typed configuration: dataclass groups that generate the flat CLI flags of the seeds.

LEAF package: no torch/ray import, so `relax-train --help` and validation are instant.
"""

from relax.config.parser import ConfigError, build_parser, parse_config
from relax.config.schema import GROUPS, RelaxConfig

__all__ = ["GROUPS", "ConfigError", "RelaxConfig", "build_parser", "parse_config"]
