"""`executor_for(args)`: a RewardExecutor whose spec comes from a flags-like namespace (the tests
write their settings as the flags' names), with that namespace as the plugins' `args`."""

from __future__ import annotations

from typing import Any

from relax.engine.rewards import RewardExecutor
from relax.engine.specs import RewardSpec

# flag name -> RewardSpec field
FIELDS = {"rm_type": "rm_type", "custom_rm_path": "custom_rm_path", "reward_key": "reward_key", "group_rm": "group_rm",
          "rm_url": "rm_url", "reward_timeout": "timeout", "reward_num_workers": "num_workers",
          "reward_max_concurrency": "max_concurrency", "reward_failure_value": "failure_value"}


def executor_for(args: Any, judge: Any = None) -> RewardExecutor:
    spec = RewardSpec(judge=judge, **{field: getattr(args, flag) for flag, field in FIELDS.items()
                                      if hasattr(args, flag)})
    return RewardExecutor(spec, args)
