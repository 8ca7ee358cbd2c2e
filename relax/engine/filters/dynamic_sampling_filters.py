"""Dynamic-sampling filters: decide, per finished group, whether it enters the training batch.

`--dynamic-sampling-filter-path` names a function `fn(args, samples: list[Sample], **kwargs)`
returning a bool or a `DynamicFilterOutput` (keep + a reason, counted in the metrics). The
built-in `check_reward_nonzero_std` is DAPO's filter: a group whose rewards are all equal has
zero GRPO advantage everywhere, so it only dilutes the batch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from relax.types import Sample


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None


def check_reward_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group only if its rewards are not all the same (DAPO, arXiv 2503.14476)."""
    rewards = [s.get_reward_value(args.reward_key) for s in samples]
    if len(rewards) > 1 and statistics.pstdev(rewards) > 0:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason="all_correct" if rewards and rewards[0] > 0 else "all_wrong")


def as_filter_output(result: Any, *, flag: str = "--dynamic-sampling-filter-path") -> DynamicFilterOutput:
    """Accept a plain bool or a DynamicFilterOutput from a user filter."""
    if isinstance(result, DynamicFilterOutput):
        return result
    if isinstance(result, bool):
        return DynamicFilterOutput(keep=result, reason=None if result else "filtered")
    raise TypeError(f"{flag}: the filter returned {type(result).__name__}; return a bool or a "
                    "relax.engine.filters.dynamic_sampling_filters.DynamicFilterOutput")
