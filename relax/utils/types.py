"""Compatibility path: Relax/slime plugins import `Sample` from `relax.utils.types`."""

from relax.types import FINISH_REASON_STATUS, Sample

__all__ = ["FINISH_REASON_STATUS", "Sample"]
