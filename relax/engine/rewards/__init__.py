"""Rewards: the built-in reward hub (`REWARD_TYPES`, `grade`) and the `RewardExecutor`.

`grade(rm_type, response, label, metadata)` scores one response with a built-in type; the
executor scores whole batches of `Sample`s with built-ins or a `--custom-rm-path` plugin,
with worker processes, timeouts and failure accounting. See docs/rewards.md.
"""

from relax.engine.rewards.executor import RewardExecutor
from relax.engine.rewards.registry import FAST_PATHS, REWARD_TYPES, RewardType, grade, known_types, resolve

__all__ = ["FAST_PATHS", "REWARD_TYPES", "RewardExecutor", "RewardType", "grade", "known_types", "resolve"]
