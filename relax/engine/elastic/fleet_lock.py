"""The engine fleet's lock: one change of the fleet at a time, a scaling operation or an engine replacement.

It lives with the fleet, in the Rollout role's process. The scaling operations there hold it directly
(`FleetScaler`'s book: `async with FleetLock.lock`); the HealthManager, in the driver, holds it across
its engine replacements by name, through two calls on the Rollout (`Rollout.hold_fleet(holder)`, then
`Rollout.free_fleet(holder)`; `relax.core.health.held_fleet`). A hold that waits is one pending
coroutine on the Rollout's event loop: the replica's other calls (generate, weight receivers, the
scaling API) go on meanwhile. A holder name stands for one hold. A holder that gives up (its caller
was cancelled while the hold waited or was still in transit) is freed all the same: its hold releases
the lock the moment it gets it, so a lost hold never leaves the fleet locked.
"""

from __future__ import annotations

import asyncio


class FleetLock:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # what scaling operations hold (and `hold` for a remote holder)
        self.holder: str | None = None  # the remote holder that has it now (None: free, or a scaling operation)
        self._given_up: set[str] = set()  # freed before their hold got the lock

    async def hold(self, holder: str) -> bool:
        """Wait for the lock and keep it for `holder` until `free(holder)`. False when `holder` was freed
        before the lock came (the lock is released again at once)."""
        if holder in self._given_up:  # freed before this call even arrived
            self._given_up.discard(holder)
            return False
        await self.lock.acquire()
        if holder in self._given_up:
            self._given_up.discard(holder)
            self.lock.release()
            return False
        self.holder = holder
        return True

    def free(self, holder: str) -> None:
        """End `holder`'s hold; a hold still waiting (or not yet arrived) ends as soon as it gets the lock."""
        if self.holder == holder:
            self.holder = None
            self.lock.release()
        else:
            self._given_up.add(holder)
