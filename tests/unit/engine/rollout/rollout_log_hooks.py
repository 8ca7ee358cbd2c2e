"""Logging hooks for tests/unit/engine/rollout/test_step_logs.py, with slime's signatures; each records
its call in CALLS."""

from __future__ import annotations

CALLS: list[tuple] = []


def skip_defaults(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    CALLS.append(("rollout", rollout_id, args, samples, rollout_extra_metrics, rollout_time))
    return True


def own_metrics(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    return {"custom/longest_response": float(max(s.response_length for s in samples))}


async def keep_defaults(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    CALLS.append(("async", rollout_id))
    return False


def skip_eval(rollout_id, args, data, extra_metrics):
    CALLS.append(("eval", rollout_id, args, data, extra_metrics))
    return True


def too_few(rollout_id, args):
    return True
