"""The async bench's verifier: the math grade, answered after `args.reward_latency_s` without
holding the event loop (many samples wait at once, as on a sandbox)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from bench.sandbox_reward import sandboxed_math


def _sample(response: str) -> SimpleNamespace:
    return SimpleNamespace(response=response, label="7", metadata=None)


def test_grades_like_the_math_reward_after_the_latency_with_samples_waiting_together():
    args = SimpleNamespace(reward_latency_s=0.3)

    async def go():
        start = time.monotonic()
        rewards = await asyncio.gather(*(sandboxed_math(args, _sample(r)) for r in
                                         ["so \\boxed{7}", "so \\boxed{8}", "no answer"] * 4))
        return rewards, time.monotonic() - start

    rewards, elapsed = asyncio.run(go())
    assert rewards == [1.0, 0.0, 0.0] * 4
    assert 0.3 <= elapsed < 1.5  # 12 samples waited at once, not one after another


def test_no_latency_configured_means_none():
    assert asyncio.run(sandboxed_math(SimpleNamespace(), _sample("\\boxed{7}"))) == 1.0
