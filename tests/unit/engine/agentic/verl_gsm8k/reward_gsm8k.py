"""verl's compute_score as a Relax reward function (the guide's "Migrate reward function")."""

from __future__ import annotations

from verl_gsm8k.verl_tool import compute_score


async def reward_func(args, sample, **kwargs):
    return {"score": compute_score(sample.response, sample.label)}
