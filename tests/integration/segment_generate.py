"""A generate function that leaves what an agent which rewrote its history leaves: the default
generate's sample, and for every odd-indexed sample a prior segment (Sample.prior_segments) of its
own: the same prompt and the first half of the response, trained on, with the engine's log-probs.
With --agent-segments auto and GRPO each such segment is a training row that shares its episode's
reward and advantage (test_elastic's fully-async run checks the rows it trained on)."""

from __future__ import annotations

from relax.engine.rollout.sglang_rollout import generate as default_generate
from relax.types import Sample


async def generate(args, sample, sampling_params, evaluation=False):
    sample = await default_generate(args, sample, sampling_params, evaluation=evaluation)
    half = sample.response_length // 2
    if sample.index % 2 and half and not evaluation:
        prompt = len(sample.tokens) - sample.response_length
        sample.prior_segments = [Sample(tokens=sample.tokens[:prompt + half], response_length=half,
                                        loss_mask=[1] * half, rollout_log_probs=sample.rollout_log_probs[:half],
                                        weight_versions=list(sample.weight_versions), status=Sample.Status.COMPLETED)]
    return sample
