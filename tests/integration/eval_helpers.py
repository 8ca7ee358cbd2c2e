"""Plugins for the eval/GenRM integration tests: a dict reward, and an eval function that
records the per-dataset args it was called with, then runs the default rollout function."""

from __future__ import annotations

import json

from relax.engine.rollout.sglang_rollout import generate_rollout


def dict_reward(args, sample, **kwargs):
    """`score`: the share of digits (trainable); `acc`: always 1 (so eval picks a visible key)."""
    text = sample.response
    return {"score": sum(ch.isdigit() for ch in text) / max(1, len(text)), "acc": 1.0}


async def eval_rollout(args, rollout_id, data_source, evaluation=False):
    with open(args.eval_probe_path, "a") as f:
        f.write(json.dumps({"evaluation": evaluation, "n": args.n_samples_per_prompt,
                            "prompts": args.rollout_batch_size, "max_response_len": args.eval_max_response_len,
                            "max_context_len": args.eval_max_context_len}) + "\n")
    return await generate_rollout(args, rollout_id, data_source, evaluation=evaluation)
