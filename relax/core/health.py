"""The HealthManager (`--use-fault-tolerance`, `--use-health-check`): watch the engines and the roles
while the run trains, recover in place what can be (tier 1), else restart the whole run from its
last checkpoint (tier 2).

Watched every `--rollout-health-check-interval` seconds (after `--rollout-health-check-first-wait`):
- every engine the run launched (rollout, GenRM judge, OPD teacher): its process is alive and answers
  GET /health within `--rollout-health-check-timeout` seconds (a SIGSTOPped engine is alive and
  silent: hung);
- with `--use-health-check`, every role: its Serve replica answers a heartbeat
  (`replica_class.relax_heartbeat`); a replica that Serve restarted after its process died answers
  with a new id.

Tier 1 (`--use-fault-tolerance`), an engine failed: its role takes it out of the router (its
requests in flight are sent again to the other engines, or wait for the replacement: each gets
exactly one reply), stops it and starts a fresh one on its device (`EngineFleet.replace`). A
rollout engine receives weights: the DCS coordinator lists the new topology and the Actor pushes
the weights its ranks hold now to the new engine alone. A GenRM or teacher engine keeps its
checkpoint's weights, which the fresh engine loads. Then the router routes to it. Replacements and
elastic scaling operations take turns: each holds the fleet's lock (for rollout engines the Rollout
keeps it, beside its scaler: `held_fleet`). An engine slot (an engine and those that replaced it)
is replaced at most `--max-engine-replacements` times per attempt; its next failure goes to tier 2.
A role replica that Serve restarted is set up again in place when the role keeps nothing of the
run but registrations (the DCS coordinator: receivers registered again).

Tier 2 (`--use-health-check`): anything else — a trainer rank or a role's process that died, a
stateful role's replica restarted, tier 1 failing, an engine failure without
`--use-fault-tolerance` — fails the run's attempt; `run_with_restarts` tears every role down and
starts again from the newest complete checkpoint under `--save` (from the start when there is
none yet), at most `--max-global-restart` times. The rows the failed attempt logged for the steps
redone are moved from `<exp-dir>/metrics.jsonl` to `metrics.jsonl.attempt-<n>`, so each step has
one row there, the resumed attempt's.

Every event is logged, appended to `<exp-dir>/health_events.jsonl`, counted in the step metrics
(`health/*`) and sent as an alert to `--notify-urls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections import Counter
from typing import Any, AsyncIterator, Awaitable, Callable, Collection, NoReturn

from relax.components.setup_context import SetupContext
from relax.config.errors import ConfigError, PlanError
from relax.config.plan import RunPlan
from relax.config.schema import RelaxConfig
from relax.utils import checkpoints
from relax.utils.metrics_sinks import METRICS_LOG, cut_metrics_log
from relax.utils.notify import Notifier

logger = logging.getLogger(__name__)

# event kind -> (step metric counting it, alert title)
EVENTS: dict[str, tuple[str, str]] = {
    "engine_failed": ("health/engine_failures", "engine failed"),
    "engine_replaced": ("health/engine_restarts", "engine replaced (tier 1)"),
    "engine_escalated": ("health/engine_escalations", "engine failed too often: tier 2"),
    "role_failed": ("health/role_failures", "role replica failed"),
    "role_restarted": ("health/role_restarts", "role set up again (tier 1)"),
    "global_restart": ("health/global_restarts", "global restart from checkpoint (tier 2)"),
}
NOT_RESTARTED = (ConfigError, PlanError, checkpoints.CheckpointError)  # the same inputs fail the same way again


class RecoveryError(RuntimeError):
    """A failure the HealthManager could not repair in place (a global restart may)."""


class HealthEvents:
    """Where recovery events go: the log, `<exp-dir>/health_events.jsonl`, counters, alerts. One per
    run, kept across global restarts."""

    def __init__(self, exp_dir: str, notifier: Notifier | None = None) -> None:
        self.path = os.path.join(exp_dir, "health_events.jsonl")
        self.notifier = notifier
        self.counts: Counter[str] = Counter()
        self.requests_resent = 0
        self.push_retries = 0

    def record(self, kind: str, message: str, **details: Any) -> None:
        metric, title = EVENTS[kind]
        self.counts[metric] += 1
        logger.warning("health: %s", message)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": time.time(), "kind": kind, "message": message, **details}) + "\n")
        if self.notifier is not None:
            self.notifier.send(title, message, "warning")

    def metrics(self) -> dict[str, float]:
        counts = {metric: float(self.counts[metric]) for metric, _ in EVENTS.values()}
        return counts | {"health/requests_resent": float(self.requests_resent),
                         "health/weight_push_retries": float(self.push_retries)}


async def first_done(main: Awaitable[Any], watcher: asyncio.Future) -> Any:
    """`await main`, unless `watcher` fails first: then `main` is cancelled and its error raised."""
    task = asyncio.ensure_future(main)
    await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        watcher.result()  # (it can only have stopped by failing)
    return task.result()


class EngineSlots:
    """Tier-1 replacements per engine slot in one attempt of the run: a slot is an engine and the
    engines that replaced it (each replacement starts on its predecessor's device)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # --max-engine-replacements
        self._slot: dict[tuple[str, str], tuple[str, str]] = {}  # (role, engine URL) -> its slot
        self._count: Counter[tuple[str, str]] = Counter()

    def _of(self, role: str, url: str) -> tuple[str, str]:
        return self._slot.get((role, url), (role, url))  # a slot is named by its first engine

    def replacements(self, role: str, url: str) -> int:
        """How often the slot of `role`'s engine at `url` was replaced so far."""
        return self._count[self._of(role, url)]

    def spent(self, role: str, url: str) -> bool:
        """The slot was replaced `limit` times already: tier 1 gives it up."""
        return self.replacements(role, url) >= self.limit

    def replaced(self, role: str, old: str, new: str) -> int:
        """`new` took the place of `old`; returns the slot's replacements so far."""
        slot = self._slot.pop((role, old), (role, old))
        self._slot[(role, new)] = slot
        self._count[slot] += 1
        return self._count[slot]


@contextlib.asynccontextmanager
async def held_fleet(role: Any) -> AsyncIterator[None]:
    """The fleet lock of `role`, which keeps it in its own process (the Rollout's, shared with its scaling
    operations: `relax.engine.elastic.fleet_lock`), held for the block; freed whatever happens, a hold
    that still waits included (the role then releases it as soon as it gets it)."""
    holder = f"health-{uuid.uuid4().hex}"
    try:
        await role.hold_fleet(holder)
        yield
    finally:
        await role.free_fleet(holder)


class HealthManager:
    def __init__(self, cfg: RelaxConfig, plan: RunPlan, roles: dict[str, Any], events: HealthEvents,
                 ctx: SetupContext, shared_fleets: Collection[str] = ()) -> None:
        """`roles`: name -> handle (`await role.method(...)`); `ctx`: what the roles' setups published;
        `shared_fleets`: the roles whose fleet lock lives in their process, shared with elastic scaling there
        (`held_fleet`); the other engine roles' locks are here. A replacement holds its role's lock."""
        self.shared_fleets = set(shared_fleets)
        self._fleet_locks: dict[str, asyncio.Lock] = {}
        self.fault, self.plan, self.roles, self.events, self.ctx = cfg.fault, plan, roles, events, ctx
        self.enabled = self.fault.use_fault_tolerance or self.fault.use_health_check
        self.replicas: dict[str, str] = {}  # role -> the replica that was set up
        self._resent_seen: dict[str, int] = {}  # per role, its router's count at the last look (new per attempt)
        self._pushes_seen = events.push_retries  # retries of earlier attempts
        # The roles whose engines the run launched (rollout, genrm, teacher): their engines are watched.
        self.engine_roles = [r.name for r in plan.roles if r.unit == "engine" and r.workers and r.name in roles]
        self.slots = EngineSlots(self.fault.max_engine_replacements)

    def metrics(self) -> dict[str, float]:
        """The step row's `health/*` counters (none when nothing is watched)."""
        return self.events.metrics() if self.enabled else {}

    async def watch(self, loop: Awaitable[Any]) -> Any:
        """Run the training `loop` with the monitor beside it; a failure the monitor cannot repair in
        place cancels the loop and raises (the run's attempt ends: tier 2)."""
        if not self.enabled:
            return await loop
        if self.fault.use_health_check:
            self.replicas = await self._heartbeats(timeout=600.0)
        monitor = asyncio.ensure_future(self._monitor())
        try:
            return await first_done(loop, monitor)
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)

    async def _monitor(self) -> None:
        f = self.fault
        await asyncio.sleep(f.rollout_health_check_first_wait)
        while True:
            await asyncio.sleep(f.rollout_health_check_interval)
            await self.check_engines()
            if f.use_health_check:
                await self._check_roles()
            await self._count_retries()

    # ---- engines -------------------------------------------------------------------------------
    async def check_engines(self) -> None:
        """One round of engine checks: every failed engine is replaced (tier 1), or RecoveryError."""
        for name in self.engine_roles:
            await self._check_engines(name)

    async def _check_engines(self, name: str) -> None:
        failed = await self.roles[name].check_engines(self.fault.rollout_health_check_timeout)
        for url, why in failed:
            self.events.record("engine_failed", f"{name} engine {url} {why.splitlines()[0]}", role=name, engine=url,
                               details=why)
        if not failed:
            return
        urls = [url for url, _ in failed]
        if not self.fault.use_fault_tolerance:
            raise RecoveryError(f"{name} engine(s) {urls} failed and --use-fault-tolerance (replace them in place) "
                                f"is off:\n{failed[0][1]}")
        for url in urls:
            if self.slots.spent(name, url):
                self._escalate(name, url)
        try:
            async with self._fleet_lock(name):  # not while a scaling operation changes the fleet
                await self._replace_engines(name, urls)
        except Exception as exc:
            raise RecoveryError(f"tier 1 failed: replacing {name} engine(s) {urls}: {type(exc).__name__}: {exc}") \
                from exc

    def _fleet_lock(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        """What a replacement of `name`'s engines holds: the lock its process keeps, or one of this process."""
        if name in self.shared_fleets:
            return held_fleet(self.roles[name])
        return self._fleet_locks.setdefault(name, asyncio.Lock())

    def _escalate(self, name: str, url: str) -> NoReturn:
        """The engine's slot was replaced --max-engine-replacements times in this attempt and failed
        again: a fresh engine there is not likely to fare better; tier 2 takes over."""
        n, after = self.slots.replacements(name, url), ("a global restart from the last checkpoint follows (tier 2)"
                                                        if self.fault.use_health_check else
                                                        "the run ends (tier 2 needs --use-health-check)")
        message = (f"{name} engine {url} failed after its slot was replaced {n} time(s) in this attempt "
                   f"(--max-engine-replacements {self.slots.limit}): tier 1 gives it up; {after}")
        self.events.record("engine_escalated", message, role=name, engine=url, replacements=n)
        raise RecoveryError(message)

    async def _replace_engines(self, name: str, urls: list[str]) -> None:
        """Tier 1: fresh engines for `urls`; a weight receiver's get the current weights before they are
        routed to, the others serve their checkpoint's weights as loaded."""
        role, start = self.roles[name], time.perf_counter()
        new = list(await asyncio.gather(*(role.replace_engine(url) for url in urls)))
        version = await self._push_weights(name, new) if name in self.plan.weight_receivers else None
        for url in new:
            await role.admit_engine(url)
        await self._count_retries()
        holding = ("its checkpoint's weights (no weight pushes)" if name not in self.plan.weight_receivers else
                   f"weight version {version if version is None else int(version)} before it was routed to")
        for old, url in zip(urls, new):
            n = self.slots.replaced(name, old, url)
            self.events.record(
                "engine_replaced", f"{name} engine {old} replaced by {url} in {time.perf_counter() - start:.1f}s, "
                f"holding {holding} (replacement {n}/{self.slots.limit} of its slot); "
                f"{self.events.requests_resent} generate request(s) re-sent so far", role=name, engine=old,
                replacement=url, weight_version=version, slot_replacements=n)

    async def _push_weights(self, name: str, new: list[str]) -> float | None:
        """The weights the Actor's ranks hold now, to the new engines `new` of weight receiver `name`
        alone (once the DCS coordinator lists them); the version they hold."""
        role = self.roles[name]
        await self._register(name)
        receivers = await role.weight_receivers()
        devices = [receivers.devices[receivers.endpoints.index(u)] for u in new]
        stats = await self.roles["actor"].restore_weights(new, devices)
        return stats.get("weight_sync/version")

    async def _register(self, name: str) -> None:
        """Register `name`'s weight receivers with the DCS coordinator again (its topology changes)."""
        await self.roles["dcs"].register(name, await self.roles[name].weight_receivers())

    async def _count_retries(self) -> None:
        """Requests re-sent by the engines' routers and weight pushes tried again, into the run's counters."""
        for name in self.engine_roles:
            resent = await self.roles[name].requests_resent()
            self.events.requests_resent += resent - self._resent_seen.get(name, 0)
            self._resent_seen[name] = resent
        if "actor" in self.roles:
            self.events.push_retries = self._pushes_seen + await self.roles["actor"].push_retries_count()

    # ---- roles ---------------------------------------------------------------------------------
    async def _heartbeats(self, timeout: float) -> dict[str, str]:
        """Role -> the replica that answered (roles that did not answer within `timeout` are left out)."""
        async def beat(name: str) -> str | None:
            try:
                return (await asyncio.wait_for(asyncio.ensure_future(self.roles[name].relax_heartbeat()),
                                               timeout))["replica"]
            except Exception as exc:  # noqa: BLE001 - a replica dying or restarting: its next heartbeat tells
                logger.info("health: role %s did not answer its heartbeat (%s: %s)", name, type(exc).__name__, exc)
                return None

        names = list(self.roles)
        answers = await asyncio.gather(*(beat(n) for n in names))
        return {n: a for n, a in zip(names, answers) if a is not None}

    async def _check_roles(self) -> None:
        for name, replica in (await self._heartbeats(self.fault.rollout_health_check_timeout)).items():
            if replica == self.replicas.get(name):
                continue
            self.events.record("role_failed", f"role {name}: Serve restarted its replica (the process died)",
                               role=name)
            if name not in SET_UP_AGAIN:
                raise RecoveryError(f"role {name}'s replica was restarted by Serve: what it held of the run "
                                    "(processes, weights, data position, the step in flight) is gone")
            start = time.perf_counter()
            await SET_UP_AGAIN[name](self)
            self.replicas[name] = replica
            self.events.record("role_restarted", f"role {name} set up again on its new replica in "
                               f"{time.perf_counter() - start:.1f}s", role=name)

    async def _set_up_coordinator(self) -> None:
        """The DCS coordinator holds only registrations: register every weight receiver again."""
        await self.roles["dcs"].setup(self.ctx)
        for name in self.plan.weight_receivers:
            await self._register(name)


# Roles whose restarted replica is set up again in place (the others hold state of the run: tier 2).
SET_UP_AGAIN: dict[str, Callable[[HealthManager], Awaitable[None]]] = {"dcs": HealthManager._set_up_coordinator}


# ---- tier 2 ----------------------------------------------------------------------------------------
def resume_config(cfg: RelaxConfig) -> tuple[RelaxConfig, str, int | None]:
    """The config of the next attempt: resume from the newest complete checkpoint under --save (the
    run as first given when there is none yet), where that is, and the checkpoint's step (None: none)."""
    save = cfg.ckpt.save
    point = checkpoints.resume_point(save, fallback=True) if save and os.path.isdir(save) else None
    if point is None:
        return cfg, "the start (no checkpoint under --save yet)" if save else "the start (no --save)", None
    resumed = cfg.replace(load=save, load_fallback=True, start_rollout_id=None, critic_load=cfg.ckpt.critic_save)
    return resumed, f"the checkpoint of step {point.rollout_id} in {save}", point.rollout_id


def run_with_restarts(cfg: RelaxConfig, attempt: Callable[[RelaxConfig], Any], events: HealthEvents) -> Any:
    """`attempt(cfg)` (a whole run: deploy, train, tear down); with --use-health-check a failed
    attempt is followed by another from the last checkpoint, at most --max-global-restart times."""
    restarts, current = 0, cfg
    log = os.path.join(cfg.misc.exp_dir, METRICS_LOG)
    since = os.path.getsize(log) if os.path.exists(log) else 0  # what is there before is another run's
    while True:
        try:
            return attempt(current)
        except Exception as exc:  # tier 2: a deliberate fault-tolerance path (logged, counted, alerted)
            f = cfg.fault
            if not f.use_health_check or isinstance(exc, NOT_RESTARTED):
                raise
            if restarts >= f.max_global_restart:
                logger.error("health: the run failed after %d global restart(s) (--max-global-restart %d)",
                             restarts, f.max_global_restart)
                raise
            restarts += 1
            current, where, step = resume_config(cfg)
            # The steps after the checkpoint are redone: the resumed attempt's rows replace the failed one's.
            moved = cut_metrics_log(log, since, step, f"{log}.attempt-{restarts}")
            redone = sorted({s for s in moved if s is not None})
            events.record("global_restart", f"global restart {restarts}/{f.max_global_restart} after "
                          f"{summary(exc)}; every role was torn down, resuming from {where}"
                          f"{_superseded(redone, moved.count(None), restarts)}",
                          error=_plain(f"{type(exc).__name__}: {exc}")[:4000], restart=restarts,
                          superseded_steps=redone)


def _superseded(steps: list[int], torn: int, attempt: int) -> str:
    """What moved out of the metrics log after attempt `attempt` failed."""
    if not steps and not torn:
        return ""
    what = [f"rows of steps {steps}"] * bool(steps) + [f"{torn} row(s) cut short"] * bool(torn)
    return f"; the failed attempt's {' and '.join(what)} moved to {METRICS_LOG}.attempt-{attempt}"


def summary(exc: BaseException) -> str:
    """`Type: first line` of the error that happened, under Ray's and Serve's wrappers (a RayTaskError
    carries the remote error as `cause`)."""
    while isinstance(getattr(exc, "cause", None), BaseException):
        exc = exc.cause
    lines = [line.strip() for line in _plain(str(exc)).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray colours the process name in remote tracebacks
