"""Custom reward plugins used by the executor tests (imported by dotted path, also in workers)."""

from __future__ import annotations

import asyncio
import time

IN_FLIGHT = {"now": 0, "max": 0}


def sync_reward(args, sample, **kwargs):
    sample.metadata["seen_by"] = "sync_reward"
    if sample.label == "hang":
        time.sleep(10**6)
    if sample.label == "boom":
        raise RuntimeError("boom on purpose")
    return 1.0 if sample.response == sample.label else 0.0


async def async_reward(args, sample, **kwargs):
    if sample.label == "hang":
        await asyncio.Event().wait()
    if sample.label == "boom":
        raise RuntimeError("boom on purpose")
    return 1.0 if sample.response == sample.label else 0.0


async def counting_reward(args, sample, **kwargs):
    IN_FLIGHT["now"] += 1
    IN_FLIGHT["max"] = max(IN_FLIGHT["max"], IN_FLIGHT["now"])
    for _ in range(5):
        await asyncio.sleep(0)
    IN_FLIGHT["now"] -= 1
    return 1.0


async def dict_reward(args, sample, **kwargs):
    return {"score": 0.5, "acc": True}


async def kwargs_reward(args, sample, **kwargs):
    return float(kwargs.get("bonus", 0)) + float(getattr(args, "base", 0))


async def group_reward(args, samples, **kwargs):
    return [float(i) for i, _ in enumerate(samples)]


def sync_group_reward(args, samples, **kwargs):
    for sample in samples:
        sample.metadata["group_size"] = len(samples)
    return [1.0 if s.response == s.label else 0.0 for s in samples]


def short_group_reward(args, samples, **kwargs):
    return [1.0]


def wrong_signature(sample):
    return 1.0


def crash_reward(args, sample, **kwargs):
    import os

    if sample.label == "crash":
        os._exit(3)
    return 1.0
