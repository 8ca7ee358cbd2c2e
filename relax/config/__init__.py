"""Typed configuration: dataclass groups that generate the flat CLI flags of the seeds.

LEAF package: no torch/ray import, so `relax-train --help` and validation are instant.
"""

from relax.config.errors import ConfigError, PlanError
from relax.config.load import parse_config
from relax.config.parser import build_parser
from relax.config.schema import GROUPS, RelaxConfig

__all__ = ["GROUPS", "ConfigError", "PlanError", "RelaxConfig", "build_parser", "parse_config"]
