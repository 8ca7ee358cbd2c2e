"""The fleet lock, kept by the Rollout (`FleetLock`, `Rollout.hold_fleet` / `free_fleet`) and shared by its
scaling operations and the HealthManager's engine replacements (`relax.core.health.held_fleet`), with real
asyncio: each waits for the other; while a hold waits, the Rollout answers other calls; a holder that gave
up (its caller cancelled while the hold waited or was still in transit) never leaves the fleet locked.

Role calls go through `Remote`: each call runs in a task of its own, as on a Serve replica, so cancelling
the caller does not cancel the call (the harder case for the lock)."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

from relax.components.rollout import Rollout
from relax.config.schema import RelaxConfig
from relax.core.health import HealthEvents, HealthManager, held_fleet
from relax.distributed.checkpoint_service.coordinator import Receivers
from relax.engine.elastic.fleet_lock import FleetLock
from relax.engine.elastic.scaler import FleetScaler, ScalerSettings

WAITING = "waiting for the fleet (an engine is being replaced)"


class Remote:
    """`await role.method(...)`, each call in a task of its own (a Serve replica runs it; the caller only waits)."""

    def __init__(self, role) -> None:
        self.role = role

    def __getattr__(self, name):
        async def call(*args):
            async def run():
                out = getattr(self.role, name)(*args)
                return await out if inspect.isawaitable(out) else out
            return await asyncio.shield(asyncio.ensure_future(run()))
        return call


class StandInRollout:
    """The Rollout's fleet lock and its real `hold_fleet` / `free_fleet`, over a fleet kept as a list; a
    replacement waits for `replacing` when it is given."""

    free_fleet = Rollout.free_fleet

    def __init__(self, log: list[str], replacing: asyncio.Event | None = None) -> None:
        self.fleet_lock, self.log, self.replacing = FleetLock(), log, replacing
        self.urls, self.failed = ["http://e0", "http://e1"], []
        self.asked: list[str] = []  # holders whose hold arrived

    async def hold_fleet(self, holder: str) -> bool:
        self.asked.append(holder)
        return await Rollout.hold_fleet(self, holder)

    async def check_engines(self, timeout: float) -> list[tuple[str, str]]:
        failed, self.failed = self.failed, []
        return failed

    async def replace_engine(self, url: str) -> str:
        self.log.append(f"replace {url}")
        if self.replacing is not None:
            await self.replacing.wait()
        self.urls[self.urls.index(url)] = new = f"{url}-new"
        return new

    async def admit_engine(self, url: str) -> None:
        self.log.append(f"admit {url}")

    def weight_receivers(self) -> Receivers:
        return Receivers(list(self.urls))

    def requests_resent(self) -> int:
        return 0


class StandInOps:
    """`FleetOps` whose launch waits for `launching` to be released (the operation holds the lock meanwhile)."""

    def __init__(self, rollout: StandInRollout) -> None:
        self.rollout, self.started, self.release = rollout, asyncio.Event(), asyncio.Event()

    async def engines(self):
        return [{"id": u, "address": u, "state": "active", "protected": True} for u in self.rollout.urls]

    async def capacity(self):
        return None

    async def launch(self, count, timeout, tag):
        self.rollout.log.append("launch")
        self.started.set()
        await self.release.wait()
        return [{"url": "http://added"}]

    async def sync(self, urls):
        return 0

    async def admit(self, url):
        self.rollout.log.append(f"admit {url}")


class Actor:
    async def restore_weights(self, urls, devices):
        return {"weight_sync/version": 3.0}

    def push_retries_count(self) -> int:
        return 0


class Coordinator:
    def register(self, role, receivers) -> int:
        return 1


def health_over(rollout: StandInRollout, tmp_path) -> HealthManager:
    cfg = RelaxConfig().replace(use_fault_tolerance=True)
    plan = SimpleNamespace(roles=[SimpleNamespace(name="rollout", unit="engine", workers=2)],
                           weight_receivers=("rollout",))
    roles = {"rollout": Remote(rollout), "actor": Remote(Actor()), "dcs": Remote(Coordinator())}
    return HealthManager(cfg, plan, roles, HealthEvents(str(tmp_path)), None, shared_fleets=("rollout",))


async def until(condition) -> None:
    """Let the other tasks run until `condition()` (a few loop turns; no clock involved)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def test_a_replacement_waits_for_a_scaling_operation_and_the_rollout_answers_meanwhile(tmp_path):
    log: list[str] = []

    async def main():
        rollout = StandInRollout(log)
        ops = StandInOps(rollout)
        scaler = FleetScaler(ops, ScalerSettings(), lock=rollout.fleet_lock.lock)
        health = health_over(rollout, tmp_path)
        op, _ = await scaler.scale_out({"num_engines": 1})
        await ops.started.wait()  # the operation holds the fleet
        rollout.failed = [("http://e1", "died: engine 1")]
        check = asyncio.ensure_future(health.check_engines())
        await until(lambda: rollout.asked)  # the HealthManager's hold arrived, and waits
        answered = await Remote(rollout).weight_receivers()  # the Rollout's other calls go on meanwhile
        assert not check.done() and "replace http://e1" not in log
        ops.release.set()
        await check
        return op, answered, rollout.fleet_lock

    op, answered, lock = asyncio.run(main())
    assert op.status == "succeeded" and answered.endpoints == ["http://e0", "http://e1"]
    assert log == ["launch", "admit http://added", "replace http://e1", "admit http://e1-new"]
    assert not lock.lock.locked() and lock.holder is None


def test_a_scaling_operation_waits_for_a_replacement(tmp_path):
    log: list[str] = []

    async def main():
        replacing = asyncio.Event()
        rollout = StandInRollout(log, replacing)
        ops = StandInOps(rollout)
        ops.release.set()
        scaler = FleetScaler(ops, ScalerSettings(), lock=rollout.fleet_lock.lock)
        rollout.failed = [("http://e1", "died: engine 1")]
        check = asyncio.ensure_future(health_over(rollout, tmp_path).check_engines())
        await until(lambda: "replace http://e1" in log)  # the HealthManager holds the fleet
        holder = rollout.fleet_lock.holder
        op, _ = await scaler.scale_out({"num_engines": 1})
        await until(lambda: op.phase != "queued")
        seen = (op.status, op.phase)
        replacing.set()
        await check
        await asyncio.wait([op.task])
        return holder, seen, op

    holder, seen, op = asyncio.run(main())
    assert holder.startswith("health-") and seen == ("pending", WAITING) and op.status == "succeeded"
    assert log == ["replace http://e1", "admit http://e1-new", "launch", "admit http://added"]


def test_a_holder_that_gave_up_never_leaves_the_fleet_locked():
    async def main():
        rollout = StandInRollout([])
        lock = rollout.fleet_lock
        await lock.lock.acquire()  # a scaling operation holds the fleet
        held = asyncio.Event()

        async def replace() -> None:
            async with held_fleet(Remote(rollout)):
                held.set()

        caller = asyncio.ensure_future(replace())
        await until(lambda: rollout.asked)  # its hold waits on the Rollout
        caller.cancel()  # the HealthManager stops (the run ends): the hold goes on remotely, then is freed
        await asyncio.gather(caller, return_exceptions=True)
        lock.lock.release()  # the operation ends: the given-up hold gets the lock and lets it go at once
        await Remote(rollout).free_fleet("late")  # a hold freed before it even arrived
        # (were the fleet left locked, these would never return: the guard makes that a failure, not a hang)
        late = await asyncio.wait_for(Remote(rollout).hold_fleet("late"), 30)
        kept = await asyncio.wait_for(Remote(rollout).hold_fleet("next"), 30)
        return held.is_set(), late, kept, lock

    held, late, kept, lock = asyncio.run(main())
    assert not held and late is False and kept is True and lock.holder == "next" and lock.lock.locked()
