"""Polling with backoff, for the fully-async roles' waits (TransferQueue rows, weight versions).

Every poll costs CPU that the roles share (on a 2-core machine, a 20 ms poll loop in each of
five roles is a visible slice of a core). A waiter that found nothing new sleeps twice as long
the next time, from `first_s` up to `max_s`, and starts over after progress: a busy pipeline
still reacts within milliseconds, an idle wait costs a few polls a second.
"""

from __future__ import annotations

import asyncio
import time


class Backoff:
    def __init__(self, first_s: float = 0.01, max_s: float = 0.2) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"need 0 < first_s <= max_s, got first_s={first_s}, max_s={max_s}")
        self.first_s, self.max_s = first_s, max_s
        self.delay = first_s

    async def wait(self) -> None:
        """Sleep the current delay, then double it (up to `max_s`)."""
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.max_s)

    def sleep(self) -> None:
        """`wait` for a blocking caller (e.g. the driver waiting for Serve apps in a thread)."""
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.max_s)

    def reset(self) -> None:
        """Progress was made: poll quickly again."""
        self.delay = self.first_s
