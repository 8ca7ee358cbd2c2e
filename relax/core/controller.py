"""The Controller: deploy the run plan's roles, then run the training loop of its mode.

`relax.config.plan.RunPlan` decides everything up front (which roles, their workers, who writes
which column, who receives weights); here it is only carried out. Deploy: every role's Serve
app starts side by side, every role with workers starts them at once (`start()`: training
ranks, engines), then each role's `setup(ctx)` runs in plan order and fills in what it
publishes (`relax.components.setup_context.SetupContext`: the GenRM router URL, the first
rollout id and the checkpoint resumed from, the prompt count);
weight receivers register with the DCS coordinator and the engines get the Actor's weights; then the
Rollout, which owns the engine fleet, starts serving the scaling REST API (relax.engine.elastic.service).

Colocate, one rollout step per iteration (roles take turns on the same devices):
    rollout.generate(k)   -> samples in TransferQueue partition train_{k}
    rollout.release_memory, trainers onload (GPUs: engines free weights and KV cache)
    scorers.forward(k)    -> their columns on the same rows (reference, teacher, critic)
    actor.train(k)        -> optimizer steps on the step (the critic then trains on its returns)
    engines resume weights, actor.update_weights(k+1), trainers offload, engines resume KV cache
Fully async: every streaming role runs its own loop over the steps (`run()`); the Controller
only paces the Actor:
    rollout.wait_step(k) -> actor.train(k) -> actor.update_weights(k+1)
Both then evaluate / checkpoint at their intervals. With --use-fault-tolerance / --use-health-check
the HealthManager (`relax.core.health`) watches engines and roles beside the loop, and `run`
restarts a failed run from its last checkpoint (tier 2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sys
import time
from typing import Any

from relax.components.setup_context import SetupContext
from relax.config.elastic import serves_scaling_api
from relax.config.plan import RunPlan
from relax.config.role_plans import StepPart
from relax.config.schema import RelaxConfig
from relax.core.checkpointer import Checkpointer
from relax.core.health import HealthEvents, HealthManager, run_with_restarts
from relax.core.metrics import DriverMetrics, ServiceMetrics, step_metrics
from relax.core.service import Runtime
from relax.utils.metrics import format_step_summary
from relax.utils.notify import Notifier
from relax.utils.timeline import Timeline, merge_traces

logger = logging.getLogger(__name__)


class RoleHandle:
    """`await role.method(*args)` on a Serve deployment handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.app_name: str = handle.app_name

    def __getattr__(self, name: str) -> Any:
        # options(method_name=...) rather than getattr: the handle has methods of its own (shutdown).
        method = self.handle.options(method_name=name)
        return lambda *args, **kwargs: method.remote(*args, **kwargs)


def due(step: int, interval: int | None) -> bool:
    return bool(interval) and step % interval == 0


def checkpoint_due(cfg: RelaxConfig, step: int, last: bool) -> bool:
    """A checkpoint after `step`: every --save-interval steps and at the end, every step with --rotate-ckpt."""
    c = cfg.ckpt
    return bool(c.save) and (c.rotate_ckpt or due(step + 1, c.save_interval) or last)


def num_rollout_steps(cfg: RelaxConfig, num_prompts: int) -> int:
    """The run's rollout steps: --num-rollout, else --num-epoch passes over the `num_prompts` prompts
    in steps of --rollout-batch-size (the last one rounded up)."""
    r = cfg.rollout
    return r.num_rollout or math.ceil(num_prompts * r.num_epoch / r.rollout_batch_size)


async def watched(call: Any, background: list[asyncio.Future]) -> Any:
    """Await `call`, but raise at once if a background role loop fails (its rows would never come)."""
    task = asyncio.ensure_future(call)
    while True:
        done, _ = await asyncio.wait([task, *background], return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        for loop in done:
            if loop.exception() is not None:
                task.cancel()
                raise loop.exception()
        background = [b for b in background if not b.done()]


class Controller:
    def __init__(self, cfg: RelaxConfig, plan: RunPlan, runtime: Runtime, events: HealthEvents | None = None) -> None:
        self.cfg, self.plan, self.runtime = cfg, plan, runtime
        self.events = events or HealthEvents(cfg.misc.exp_dir)  # recovery events (kept across global restarts)
        self.health: HealthManager | None = None  # set on deploy
        self.scaling_api: str | None = None  # the Rollout serves the scaling API here (set on deploy)
        self.exp_dir = cfg.misc.exp_dir
        self.metrics: DriverMetrics | ServiceMetrics | None = None  # the metrics sinks (set on deploy)
        self.roles: dict[str, RoleHandle] = {}
        self.eval_history: dict[str, list[tuple[int, float]]] = {}
        self.timeline = Timeline(cfg.logging.timeline_dump_dir, "controller")  # --timeline-dump-dir
        self.checkpoints: Checkpointer | None = None  # set on deploy

    async def deploy(self) -> None:
        # The roles' replicas start side by side; wait_running raises a constructor's error.
        for role in self.plan.roles:
            self.roles[role.name] = RoleHandle(self.runtime.deploy_role(role, self.cfg, self.plan.part(role.name)))
        self.checkpoints = Checkpointer(self.cfg.ckpt, self._with(StepPart.CHECKPOINTS))
        self.metrics = step_metrics(self.cfg, self.roles)  # --use-metrics-service: the metrics role
        await asyncio.to_thread(self.runtime.wait_running)
        # Every role's processes (training ranks, engines) start at once, then the setups run in
        # plan order: a role may use what the ones before it published.
        await asyncio.gather(*(self.roles[r.name].start() for r in self.plan.roles if r.workers))
        ctx = SetupContext()
        for role in self.plan.roles:
            ctx = await self.roles[role.name].setup(ctx)
        self.start = ctx.start_rollout_id
        self.num_rollout = num_rollout_steps(self.cfg, ctx.num_prompts)
        dcs = self.roles["dcs"]
        for name in self.plan.weight_receivers:
            await dcs.register(name, await self.roles[name].weight_receivers())
        await self.actor.connect_dcs(dcs.handle)
        await self.actor.update_weights(self.start)  # engines serve the actor's weights from step 0
        await self.move_trainers("offload")  # colocate on shared GPUs: the engines generate first
        # One change of the engine fleet at a time: the Rollout's fleet lock is held by its scaling operations
        # and by the health manager's replacements of its engines.
        self.health = HealthManager(self.cfg, self.plan, self.roles, self.events, ctx, shared_fleets=("rollout",))
        await self.start_scaling(dcs)  # the engines hold the weights now: new ones can get the same

    @property
    def actor(self) -> RoleHandle:
        return self.roles["actor"]

    @property
    def rollout(self) -> RoleHandle:
        return self.roles["rollout"]

    async def start_scaling(self, dcs: RoleHandle) -> None:
        """The scaling REST API (and autoscaler) of the run, served by the Rollout role, which owns the fleet;
        weights for added engines come from the Actor through the DCS coordinator (their handles)."""
        if not serves_scaling_api(self.cfg) or "rollout" not in self.plan.weight_receivers:
            return
        self.scaling_api = await self.rollout.start_scaling(self.actor.handle, dcs.handle)
        print(f"scaling API: {self.scaling_api}, served by the Rollout role (relax-scale --exp-dir {self.exp_dir} "
              "status)", flush=True)

    async def stop_scaling(self, timeout_s: float = 120.0) -> None:
        """The Rollout rolls back (or finishes) a scaling operation in flight and stops the API; given up
        after `timeout_s` or when its replica is gone (the Rollout's shutdown tries again)."""
        if self.scaling_api is None or self.rollout.app_name in self.runtime.failed_apps or \
                "rollout" in self.runtime.lost_roles():
            return
        try:
            await asyncio.wait_for(asyncio.ensure_future(self.rollout.stop_scaling()), timeout_s)
        except Exception as err:  # noqa: BLE001 - the roles shut down regardless
            logger.warning("the scaling service did not stop: %r", err)

    def _with(self, part: StepPart) -> list[RoleHandle]:
        return [self.roles[r.name] for r in self.plan.roles_with(part)]

    async def train(self) -> None:
        cfg = self.cfg
        if cfg.eval.eval_interval and not cfg.eval.skip_eval_before_train:
            await self.metrics.log(self.start, self.record_eval(self.start, await self.rollout.evaluate(self.start)))
        loop = {"colocate": self.colocate_loop, "fully_async": self.fully_async_loop}[self.plan.mode]
        await loop()
        await self.checkpoints.finish()  # --async-save: the last checkpoint's write (its failure raised)

    async def colocate_loop(self) -> None:
        span = self.timeline.span
        for step in range(self.start, self.num_rollout):
            t0 = time.perf_counter()
            with span("rollout", step=step):
                metrics = await self.with_progress(self.rollout.generate(step), step)
            with span("release engines + onload trainers", step=step):
                metrics |= await self.rollout.release_memory()
                metrics |= await self.move_trainers("onload")
            with span("score", step=step):
                for scorer in self._with(StepPart.SCORES):
                    metrics |= await scorer.forward(step)
            with span("train", step=step):
                metrics |= await self.actor.train(step)
                for trainer in self._with(StepPart.TRAINS_AFTER_ACTOR):  # the critic fits the returns the actor wrote
                    metrics |= await trainer.train(step)
            with span("weight sync", step=step):
                await self.rollout.resume_memory(["weights"])
                metrics |= await self.actor.update_weights(step + 1)
                metrics |= await self.move_trainers("offload")
                await self.rollout.resume_memory(["kv_cache"])
            await self.after_step(step, metrics, t0)

    async def move_trainers(self, method: str) -> dict[str, float]:
        """Colocate on shared GPUs: every training role's ranks `offload` their state to the host
        while the engines generate and `onload` it before scoring and training (the plan says)."""
        metrics: dict[str, float] = {}
        if self.plan.offload_train:
            for role in self.plan.roles:
                if role.unit == "rank" and role.workers:
                    for key, value in (await getattr(self.roles[role.name], method)()).items():
                        metrics[key] = max(value, metrics.get(key, value))  # the GPU's worst case
        return metrics

    async def fully_async_loop(self) -> None:
        background = [asyncio.ensure_future(role.run(self.start, self.num_rollout))
                      for role in self._with(StepPart.STREAMS)]
        try:
            span = self.timeline.span
            for step in range(self.start, self.num_rollout):
                t0 = time.perf_counter()
                with span("wait for rollout", step=step):
                    metrics = await watched(self.rollout.wait_step(step), background)  # generated ahead: no bar
                metrics["time/trainer_wait"] = time.perf_counter() - t0  # (the autoscaler's signal)
                with span("train", step=step):
                    metrics |= await watched(self.actor.train(step), background)
                    for trainer in self._with(StepPart.TRAINS_AFTER_ACTOR):
                        metrics |= await watched(trainer.train(step), background)
                with span("weight sync", step=step):
                    metrics |= await self.actor.update_weights(step + 1)
                await self.after_step(step, metrics, t0)
            await asyncio.gather(*background)
        finally:
            for task in background:
                task.cancel()

    async def after_step(self, step: int, metrics: dict[str, float], t0: float) -> None:
        """Evaluate, checkpoint and log at the configured intervals (both modes)."""
        cfg = self.cfg
        last = step + 1 == self.num_rollout
        if cfg.eval.eval_interval and (due(step + 1, cfg.eval.eval_interval) or last):
            with self.timeline.span("eval", step=step):
                metrics |= self.record_eval(step + 1, await self.rollout.evaluate(step + 1))
        if checkpoint_due(cfg, step, last):
            with self.timeline.span("checkpoint", step=step):
                await self.checkpoint(step)
        if cfg.ckpt.save_hf and last:
            metrics["export/hf_path"] = await self.actor.export_hf(step)
        metrics["time/step"] = time.perf_counter() - t0
        metrics |= self.health.metrics()  # health/*: failures seen, engines replaced, global restarts
        if self.scaling_api is not None:  # elastic/*: engines, scaling operations (the row feeds the autoscaler)
            metrics |= await self.rollout.scaling_metrics(step, metrics)
        await self.metrics.log(step, metrics)
        print(format_step_summary(step, self.num_rollout, metrics), flush=True)

    async def checkpoint(self, step: int) -> None:
        """Every checkpointing role writes its part; then the checkpoint is committed (manifest,
        pointer) and old ones pruned (with --async-save once the writes are done: `Checkpointer`).
        A crash before the commit leaves the previous one latest."""
        await self.checkpoints.save(step)

    async def finish_checkpoint(self) -> None:
        """When the run stops early: commit the checkpoint still being written (--async-save), so
        a restart resumes from it; a failed write is logged (the run's own error is raised)."""
        if self.checkpoints is None or self.checkpoints.pending is None:
            return
        try:
            await self.checkpoints.finish()
        except Exception as err:  # noqa: BLE001 - the run already failed with an error of its own
            logger.error("the checkpoint being written when the run stopped is not committed: %r", err)

    async def with_progress(self, call: Any, step: int) -> dict[str, float]:
        """Await the rollout while drawing a progress bar from its counters."""
        task = asyncio.ensure_future(call)
        bar = None
        if self.cfg.logging.progress_bar:
            from tqdm import tqdm

            bar = tqdm(desc=f"rollout {step + 1}/{self.num_rollout}", unit="sample", leave=False, file=sys.stderr)
        while not task.done():
            await asyncio.wait([task], timeout=0.5)
            if bar is not None and not task.done():
                done, total = await self.rollout.progress()
                bar.total = total
                bar.n = done
                bar.refresh()
        if bar is not None:
            bar.close()
        return task.result()

    def record_eval(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        for key, value in metrics.items():
            if key.endswith("/reward_mean"):
                self.eval_history.setdefault(key[len("eval/"):-len("/reward_mean")], []).append((step, value))
        logger.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in metrics.items() if "reward" in k})
        return metrics

    def summary(self) -> dict[str, Any]:
        return {name: {"before": hist[0][1], "after": hist[-1][1], "history": hist}
                for name, hist in self.eval_history.items()}

    async def shutdown(self) -> None:
        await self.finish_checkpoint()
        await self.stop_scaling()  # no scaling operation while the roles go
        # Actor first: it tears down its weight-sync group while the engines still answer.
        for name in sorted(self.roles, key=lambda name: name != "actor"):
            if self.roles[name].app_name not in self.runtime.failed_apps:  # no replica to ask
                try:
                    await self._shut_down_role(name)
                except Exception as err:  # noqa: BLE001 - shut down the other roles regardless
                    logger.warning("role %s: shutdown failed: %r", name, err)
        if self.metrics is not None:
            await self.metrics.close()
        if self.timeline.enabled:
            logger.info("timeline: %s (open in https://ui.perfetto.dev)", merge_traces(self.timeline.directory))

    async def _shut_down_role(self, name: str, timeout_s: float = 60.0) -> None:
        """`shutdown()` of one role, given up after `timeout_s`, or as soon as the role's node has left
        the cluster (its replica will never answer: relax.distributed.ray.nodes)."""
        call = asyncio.ensure_future(self.roles[name].shutdown())
        deadline = time.monotonic() + timeout_s
        while not call.done():
            await asyncio.wait([call], timeout=2.0)
            if call.done():
                break
            if name in self.runtime.lost_roles() or time.monotonic() > deadline:
                call.cancel()
                logger.warning("role %s: no shutdown (%s)", name, "its node left the cluster"
                               if name in self.runtime.lost_roles() else f"no reply within {timeout_s:.0f}s")
                return
        call.result()


async def _run(cfg: RelaxConfig, runtime: Runtime, events: HealthEvents | None = None) -> dict[str, Any]:
    controller = Controller(cfg, runtime.plan, runtime, events)
    try:
        await controller.deploy()
        await controller.health.watch(controller.train())  # a failure it cannot repair ends the attempt
        return controller.summary()
    finally:
        await controller.shutdown()


def attempt(cfg: RelaxConfig, events: HealthEvents) -> dict[str, Any]:
    """Start the runtime, deploy, train, tear everything down (one attempt of the run)."""
    with Runtime(cfg) as runtime:
        try:
            return runtime.run(_run(cfg, runtime, events))  # SIGTERM stops it as Ctrl-C does (SigtermStop)
        except Exception as exc:  # a node that left the cluster is named, with the roles it held
            lost = runtime.lost_node_error(exc)
            if lost is None:
                raise
            raise lost from exc


def run(cfg: RelaxConfig) -> int:
    """Run a whole training job; every process it started is gone when this returns."""
    os.makedirs(cfg.misc.exp_dir, exist_ok=True)
    notifier = Notifier(cfg.logging.notify_urls, run_name=os.path.basename(os.path.abspath(cfg.misc.exp_dir)))
    notifier.started({"mode": "fully async" if cfg.cluster.fully_async else "colocate",
                      "steps": cfg.rollout.num_rollout, "outputs": cfg.misc.exp_dir})
    events = HealthEvents(cfg.misc.exp_dir, notifier)
    try:
        summary = run_with_restarts(cfg, lambda c: attempt(c, events), events)  # tier 2 (--use-health-check)
    except BaseException as exc:
        notifier.failed(exc)
        notifier.flush()
        raise
    with open(os.path.join(cfg.misc.exp_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    for name, s in summary.items():
        print(f"eval {name}: before={s['before']:.3f} after={s['after']:.3f}", flush=True)
    logger.info("run finished; outputs in %s", cfg.misc.exp_dir)
    notifier.finished(summary)
    notifier.flush()
    return 0
