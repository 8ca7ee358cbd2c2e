"""The async bench's verifier: the built-in `math` reward behind a sandbox's latency.

Code-execution sandboxes, remote reward models and LLM judges answer after a wall-clock delay
that costs the trainer's devices nothing (verl's sandbox fusion, slime's remote RM). Here the
delay is `args.reward_latency_s` seconds of `asyncio.sleep` per sample (set by
`bench/async_speedup.py --reward-latency` through `--custom-config-path`), then the answer is
graded exactly as `--rm-type math` grades it. No CPU is spent while waiting, so on the 2-core
machine the latency is time that a synchronous step waits through and an asynchronous
pipeline can fill."""

from __future__ import annotations

import asyncio
from typing import Any

from relax.engine.rewards.registry import grade


async def sandboxed_math(args: Any, sample: Any, **kwargs: Any) -> float | dict[str, Any]:
    await asyncio.sleep(float(getattr(args, "reward_latency_s", 0.0)))
    return grade("math", sample.response, sample.label, sample.metadata or {})
