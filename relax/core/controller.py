"""The Controller: deploy the roles, then run the training loop of the chosen mode.

Colocate, one rollout step per iteration (roles take turns on the same devices):
    rollout.generate(k)  -> samples in TransferQueue partition train_{k}, weight version k
    scorers .forward(k)  -> columns on the same rows: reference ref_log_probs (--use-kl-loss),
                            teacher teacher_log_probs (--use-opd), critic values (ppo)
    actor.train(k)       -> advantages, old log-probs, optimizer steps, partition cleared
                            (with a critic: returns written, critic.train(k) clears it)
    actor.update_weights(k+1) -> engines hold version k+1
Fully async: Rollout, ActorFwd, Reference and Advantages each run their own loop over the
steps (`run()`), streaming through the step partitions; Rollout starts step k only once the
engines hold version >= k - max_staleness. The Controller only paces the Actor:
    rollout.wait_step(k) -> actor.train(k) (once every row is complete) -> actor.update_weights(k+1)
Both then evaluate / checkpoint at their intervals. Everything else (engines, routing,
rewards, data position, DP fan-out, weight-sync topology) lives in the roles.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any

from relax.components.actor import needs_reference, needs_teacher, uses_critic
from relax.components.genrm import needs_genrm
from relax.components.rollout import rollout_gpus
from relax.config.schema import RelaxConfig
from relax.core.service import Runtime
from relax.utils.metrics import MetricsTracker, format_step_summary

logger = logging.getLogger(__name__)


class RoleHandle:
    """`await role.method(*args)` on a Serve deployment handle."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.app_name: str = handle.app_name

    def __getattr__(self, name: str) -> Any:
        # options(method_name=...) rather than getattr: the handle has methods of its own (shutdown).
        method = self._handle.options(method_name=name)
        return lambda *args, **kwargs: method.remote(*args, **kwargs)


def due(step: int, interval: int | None) -> bool:
    return bool(interval) and step % interval == 0


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
    def __init__(self, cfg: RelaxConfig, runtime: Runtime) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.exp_dir = cfg.misc.exp_dir
        self.tracker = MetricsTracker(self.exp_dir, use_tensorboard=cfg.logging.use_tensorboard,
                                      tb_dir=cfg.logging.tb_project_name, tb_name=cfg.logging.tb_experiment_name)
        self.reference: RoleHandle | None = None
        self.stages: list[RoleHandle] = []  # fully async: ActorFwd, Advantages
        self.dcs: Any = None  # fully async: the DCS coordinator's Serve handle
        self.genrm: RoleHandle | None = None
        self.teacher: RoleHandle | None = None
        self.critic: RoleHandle | None = None
        self.eval_history: dict[str, list[tuple[int, float]]] = {}

    async def deploy(self) -> None:
        rt, cfg = self.runtime, self.cfg
        genrm_url = None
        if needs_genrm(cfg):  # the judge is up before the Rollout builds its rewards
            self.genrm = RoleHandle(rt.deploy_role("genrm", cfg))
            genrm_url = (await self.genrm.setup())["url"]
        # The roles' replicas start side by side; wait_running raises a constructor's error.
        self.actor = RoleHandle(rt.deploy_role("actor", cfg, wait=False))
        self.rollout = RoleHandle(rt.deploy_role("rollout", cfg, num_gpus=rollout_gpus(cfg, rt.cluster_gpus()),
                                                 wait=False))
        if needs_reference(cfg):
            self.reference = RoleHandle(rt.deploy_role("reference", cfg, "reference", wait=False))
        if needs_teacher(cfg):
            self.teacher = RoleHandle(rt.deploy_role("teacher", cfg, wait=False))
        if uses_critic(cfg):
            self.critic = RoleHandle(rt.deploy_role("critic", cfg, wait=False))
        if cfg.cluster.fully_async:
            if not cfg.algo.use_rollout_logprobs:
                self.stages.append(RoleHandle(rt.deploy_role("actor_fwd", cfg, "actor_fwd", wait=False)))
            self.stages.append(RoleHandle(rt.deploy_role("advantages", cfg, wait=False)))
            self.dcs = rt.deploy_role("dcs", wait=False)
        await asyncio.to_thread(rt.wait_running)
        self.start = (await self.actor.setup())["start_rollout_id"]
        info = await self.rollout.setup(self.start, genrm_url)
        for role in [*self.scorers, *self.stages]:
            await role.setup()
        self.num_rollout = cfg.rollout.num_rollout or math.ceil(
            info["num_prompts"] * cfg.rollout.num_epoch / cfg.rollout.rollout_batch_size)
        if self.dcs is not None:  # receivers register; the Actor builds its group from the topology
            await self.dcs.register.remote("rollout", info["engine_urls"])
            if not cfg.algo.use_rollout_logprobs:
                await self.dcs.register.remote("actor_fwd", await self.stages[0].receivers())
            await self.actor.connect_dcs(self.dcs)
        else:
            await self.actor.connect_engines(info["engine_urls"])
        await self.actor.update_weights(self.start)  # engines serve the actor's weights from step 0

    async def train(self) -> None:
        cfg = self.cfg
        if cfg.eval.eval_interval and not cfg.eval.skip_eval_before_train:
            self.tracker.log(self.start, self.record_eval(self.start, await self.rollout.evaluate(self.start)))
        await (self.fully_async_loop() if cfg.cluster.fully_async else self.colocate_loop())

    async def colocate_loop(self) -> None:
        for step in range(self.start, self.num_rollout):
            t0 = time.perf_counter()
            metrics = await self.with_progress(self.rollout.generate(step), step)
            await self.rollout.release_memory()
            for scorer in self.scorers:
                metrics |= await scorer.forward(step)
            metrics |= await self.actor.train(step)
            if self.critic is not None:  # fits the returns the actor wrote, clears the partition
                metrics |= await self.critic.train(step)
            await self.rollout.resume_memory()
            metrics |= await self.actor.update_weights(step + 1)
            await self.after_step(step, metrics, t0)

    async def fully_async_loop(self) -> None:
        streams = [self.rollout, *self.scorers, *self.stages]
        background = [asyncio.ensure_future(role.run(self.start, self.num_rollout)) for role in streams]
        try:
            for step in range(self.start, self.num_rollout):
                t0 = time.perf_counter()
                metrics = await watched(self.rollout.wait_step(step), background)  # generated ahead: no bar
                metrics |= await watched(self.actor.train(step), background)
                if self.critic is not None:  # fits the step's returns, clears the partition
                    metrics |= await watched(self.critic.train(step), background)
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
            metrics |= self.record_eval(step + 1, await self.rollout.evaluate(step + 1))
        if cfg.ckpt.save and (due(step + 1, cfg.ckpt.save_interval) or last):
            await self.actor.save(step)
            await self.rollout.save(step)
            if self.critic is not None:
                await self.critic.save(step)
        if cfg.ckpt.save_hf and last:
            metrics["export/hf_path"] = await self.actor.export_hf(step)
        metrics["time/step"] = time.perf_counter() - t0
        self.tracker.log(step, metrics)
        print(format_step_summary(step, self.num_rollout, metrics), flush=True)

    @property
    def scorers(self) -> list[RoleHandle]:
        """Roles that write columns onto a step's rows before the actor trains on them."""
        return [r for r in (self.reference, self.teacher, self.critic) if r is not None]

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
        # Actor first: it tears down its weight-sync group while the engines still answer.
        for role in (getattr(self, "actor", None), *self.scorers, *self.stages, getattr(self, "rollout", None),
                     self.genrm):
            if role is not None and role.app_name not in self.runtime.failed_apps:  # no replica to ask
                try:
                    await asyncio.wait_for(asyncio.ensure_future(role.shutdown()), timeout=60)
                except Exception as err:  # noqa: BLE001 - shut down the other roles regardless
                    logger.warning("role shutdown failed: %s", err)
        self.tracker.close()


async def _run(cfg: RelaxConfig, runtime: Runtime) -> dict[str, Any]:
    controller = Controller(cfg, runtime)
    try:
        await controller.deploy()
        await controller.train()
        return controller.summary()
    finally:
        await controller.shutdown()


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(cfg: RelaxConfig) -> int:
    """Run a whole training job; every process it started is gone when this returns."""
    cfg.misc.exp_dir = os.path.abspath(cfg.misc.exp_dir or os.path.join("outputs", time.strftime("%Y%m%d-%H%M%S")))
    os.makedirs(cfg.misc.exp_dir, exist_ok=True)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    with Runtime(cfg) as runtime:
        summary = asyncio.run(_run(cfg, runtime))
    with open(os.path.join(cfg.misc.exp_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    for name, s in summary.items():
        print(f"eval {name}: before={s['before']:.3f} after={s['after']:.3f}", flush=True)
    logger.info("run finished; outputs in %s", cfg.misc.exp_dir)
    return 0
