"""The GPU async bench's generate function: long-tailed response lengths on a random-weight policy.

A random Qwen3-shaped model almost never samples its EOS, so every response would run to
`--rollout-max-response-len`. Real reasoning traces are long-tailed instead: most are short, a
few are many times longer, and a synchronous step waits for its longest. This generate function
gives each sample a length drawn from an exponential of mean `args.long_tail_mean` tokens (capped
at the request's `max_new_tokens`), from a generator seeded by `args.long_tail_seed` and the
sample's index, so colocate and fully async runs generate exactly the same lengths. The request
then decodes that many tokens (`ignore_eos`) through the default single-turn generate (set by
`bench/gpu_async_speedup.py` through `--custom-config-path`)."""

from __future__ import annotations

import random
from typing import Any

from relax.engine.rollout.sglang_rollout import generate as default_generate


def response_length(seed: int, index: int, mean: float, cap: int) -> int:
    """Exponential(mean) tokens, at least 1 and at most `cap`, fixed by (seed, sample index)."""
    rng = random.Random(f"{seed}:{index}")
    return max(1, min(cap, round(rng.expovariate(1.0 / mean))))


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    cap = int(sampling_params.get("max_new_tokens") or getattr(args, "rollout_max_response_len", 0) or 1024)
    length = response_length(int(getattr(args, "long_tail_seed", 0)), int(sample.index or 0),
                             float(getattr(args, "long_tail_mean", 64)), cap)
    params = dict(sampling_params, max_new_tokens=length, ignore_eos=True)
    return await default_generate(args, sample, params, evaluation=evaluation)
