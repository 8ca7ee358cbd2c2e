import asyncio
import threading

import pytest

from relax.utils.poll import Backoff


def test_backoff_doubles_to_the_cap_and_resets(monkeypatch):
    slept = []
    here = threading.get_ident()
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds, *args):
        if threading.get_ident() != here:  # another test's leftover event loop thread sleeps for real
            return await real_sleep(seconds, *args)
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    backoff = Backoff(first_s=0.01, max_s=0.05)

    async def waits(n):
        for _ in range(n):
            await backoff.wait()

    asyncio.run(waits(5))
    assert slept == [0.01, 0.02, 0.04, 0.05, 0.05]
    backoff.reset()
    asyncio.run(waits(1))
    assert slept[-1] == 0.01


def test_backoff_rejects_bad_bounds():
    with pytest.raises(ValueError, match="first_s"):
        Backoff(first_s=0.5, max_s=0.1)


def test_blocking_sleep_follows_the_same_schedule(monkeypatch):
    import time

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    backoff = Backoff(first_s=0.05, max_s=0.15)
    for _ in range(3):
        backoff.sleep()
    assert slept == [0.05, 0.1, 0.15]
