"""Three training steps of one Trainer rank with its profiler's step marks around each (the profiling tests)."""

from __future__ import annotations

from typing import Any


def run_profiled_steps(rank: Any, batch: Any, steps: int = 3) -> None:
    """`steps` times: mark a step, score the old log-probs, train one optimizer step, end the step."""
    for _ in range(steps):
        rank.profile_step_begin()
        batch.old_log_probs_RT = rank.compute_log_probs(batch.tokens_RL, batch.response_lengths_R)
        rank.train(batch, 1, [5])
        rank.profile_step_end()
