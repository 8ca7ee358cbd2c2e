"""Rollout role: owns the inference engines (an `EngineFleet` behind its router), the data source, the
rewards and the default rollout (`Generator`).

Each step it runs the rollout function and writes the scored samples into that step's TransferQueue
partition. It also evaluates on held-out sets, releases/resumes engine memory around training when its
plan says so (colocate), and saves its data position with checkpoints. Its plan part (`RolloutPlan`) says
whether groups stream into the partition as they finish and whether steps overlap (fully async); `run()`
is the streaming loop. Plugins get the seed's `args` (`plugin_args`), built once; nothing of the run is
written on the config. Elastic scaling is served from here, where the fleet is: the REST API, the scaler
and the autoscaler run on this replica's event loop (`start_scaling`); the fleet's lock is held here by
scaling operations and, through `hold_fleet`, by the HealthManager's engine replacements. A plain class
with async methods: the Controller deploys it as a Ray Serve deployment, tests can drive it directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import copy
import inspect
import logging
import os
import time
from argparse import Namespace
from typing import TYPE_CHECKING, Any

from relax.components.engine_launch import engine_context_len, engine_options, generate_defaults
from relax.components.setup_context import SetupContext
from relax.config.eval_config import EvalDataset, eval_datasets
from relax.config.fault import recovery_window_s
from relax.config.plan import RolloutPlan
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.distributed.checkpoint_service.coordinator import Receivers
from relax.engine.agentic import episode_generate
from relax.engine.elastic.fleet_lock import FleetLock
from relax.engine.elastic.local_ops import Gpus, LocalFleetOps
from relax.engine.elastic.run_ops import RunFleetOps, RunWeights
from relax.engine.elastic.service import NoScaling, ScalingService
from relax.engine.fleet import EngineFleet, FleetSpec, NoFleet
from relax.engine.rewards.executor import RewardExecutor
from relax.engine.rewards.genrm import judge_spec
from relax.engine.rollout import sglang_rollout
from relax.engine.rollout.evaluation import EVAL_FUNCTION_SIGNATURE, EvalDataSource, eval_args, eval_groups
from relax.engine.rollout.generator import Generator, StepState
from relax.engine.rollout.partial_rollout import partial_metrics
from relax.engine.rollout.profiling import EngineProfiler, ProfileSpec
from relax.engine.rollout.prompt_encoding import PromptEncoder
from relax.engine.rollout.replay import dump_rollout_details, save_rollout
from relax.engine.rollout.step_logs import EvalSet, LogSpec, StepLogger
from relax.engine.router.slime_router import SlimeRouterSpec
from relax.engine.specs import RewardSpec, RolloutSpec
from relax.types import MEDIA_COLUMN, Sample
from relax.utils import checkpoints
from relax.utils.http_utils import close_sessions
from relax.utils.logging import run_token
from relax.utils.plugins import call_maybe_async, import_object, load_plugin

if TYPE_CHECKING:
    from relax.distributed.ray.placement import GpuSlots

logger = logging.getLogger(__name__)


DEFAULT_ROLLOUT = "relax.engine.rollout.sglang_rollout.generate_rollout"
REPLAY_ROLLOUT = "relax.engine.rollout.replay.replay_rollout"
ROLLOUT_SIGNATURE = "generate_rollout(args, rollout_id, data_source, evaluation=False)"


def plugin_args(cfg: RelaxConfig, router_url: str | None) -> Namespace:
    """The namespace user plugins are called with: every flag (seed names), the extra
    `--custom-config-path` keys, and where the router listens (`sglang_router_ip`/`_port`, as
    slime sets them). Built once; nothing of the run is written onto it later."""
    args = cfg.args
    host, _, port = (router_url or "").removeprefix("http://").rpartition(":")
    args.sglang_router_ip, args.sglang_router_port = (host or None), (int(port) if port else None)
    return args


def make_data_source(cfg: RelaxConfig, args: Namespace) -> Any:
    """The run's prompt source: --data-source-path's class, constructed as `cls(args)` (the seed's
    signature) with the plugin args."""
    return import_object(cfg.data.data_source_path, flag="--data-source-path")(args)


class Rollout:
    def __init__(self, cfg: RelaxConfig, plan: RolloutPlan) -> None:
        tq.start_replica()
        self.cfg, self.plan = cfg, plan
        self.token = run_token()
        self.fleet: EngineFleet | NoFleet = NoFleet()  # `start` launches the engines (a replay has none)
        self.gpu_slots: GpuSlots | None = None  # GPU clusters: what holds the engines' GPUs
        self.tokenizer: Any = None
        self.eval_sets: dict[str, tuple[EvalDataset, list[Sample]]] = {}
        self._evaluators: dict[str, tuple[Any, Any]] = {}  # dataset -> (plugin args, generator or None)
        self.current: StepState = StepState()  # the step generating now (colocate: one at a time)
        # Fully async: finished steps' metrics (and an event per step), data-source snapshots
        # taken at step boundaries (checkpoints save the trained step's position, not the
        # generated one), and the engine version each step started at.
        self.finished: dict[int, dict[str, float]] = {}
        self.step_events: dict[int, asyncio.Event] = {}
        self.snapshots: dict[int, dict[str, Any]] = {}
        self.failed: dict[int, BaseException] = {}
        self._busy_mark: dict[str, float] = {}  # engines' busy seconds when the last step reported
        self.fleet_lock = FleetLock()  # one change of the fleet at a time: scaling, engine replacement (`hold_fleet`)
        self.scaling: ScalingService | NoScaling = NoScaling()  # the scaling API and autoscaler (`start_scaling`)
        self.added_gpus: Gpus | None = None  # on GPUs: what holds the GPUs of engines a scale-out added
        self.stopping = False

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Launch the engines behind their router (from this replica's long-lived event-loop
        thread: an engine's parent-death signal fires when the launching thread exits); the
        tokenizer loads meanwhile."""
        role = self.plan.role
        if role.slots:  # a GPU cluster: hold each engine's share of its GPUs, then start it on them
            from relax.distributed.ray.placement import GpuSlots

            self.gpu_slots = await asyncio.to_thread(GpuSlots, role.slots, role.gpu_fraction)
        self.fleet = EngineFleet(self._fleet_spec())
        launched = 0 if self.cfg.rollout.rollout_external else self.plan.role.workers  # external: all running
        await asyncio.gather(self.fleet.start(launched), asyncio.to_thread(self._tokenizer))

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.ckpt.hf_checkpoint)
        return self.tokenizer

    async def setup(self, ctx: SetupContext) -> SetupContext:
        """Build the rewards, the generator and the data source (resuming its position).
        `ctx`: the first rollout id and the checkpoint resumed from (the Actor's), the GenRM router."""
        cfg = self.cfg
        self.args = plugin_args(cfg, self.fleet.router_url)
        judge = await asyncio.to_thread(judge_spec, ctx.genrm_url, cfg.reward.genrm_model_path,
                                        cfg.reward.genrm_sampling_config, cfg.custom.get("genrm_prompt_template"))
        self.rewards = RewardExecutor(RewardSpec.from_config(cfg.reward, judge, cfg.router.http_proxy), self.args)
        self.step_logs = StepLogger(LogSpec.from_config(cfg), self.args)  # metrics, sample logs, logging hooks
        self.profiler = EngineProfiler(ProfileSpec.from_config(cfg), self.fleet)  # --sglang-profile
        tokenizer = await asyncio.to_thread(self._tokenizer)
        processor = pipelines = encoder = None
        if cfg.data.multimodal_keys:  # placeholders -> the model's media tokens, media -> encoder tensors
            from relax.utils.multimodal.processor import MultimodalProcessor

            processor = await asyncio.to_thread(MultimodalProcessor.for_run, cfg.ckpt.hf_checkpoint, tokenizer,
                                                cfg.data)
            pipelines = processor.pipelines(cfg.data)  # the media flags, in the model's own units
            encoder = PromptEncoder(tokenizer, processor, pipelines, pool_size=cfg.data.mm_processor_pool_size,
                                    model_path=cfg.ckpt.hf_checkpoint, data_flags=cfg.data)
        self.generator = Generator(RolloutSpec.from_config(cfg), tokenizer=tokenizer,
                                   router_url=f"{self.fleet.router_url or ''}/generate",
                                   rewards=self.rewards, plugin_args=self.args, processor=processor,
                                   pipelines=pipelines, encoder=encoder, episodes=episode_generate)
        sglang_rollout.bind(self.args, self.generator)
        self.data_source = await asyncio.to_thread(make_data_source, cfg, self.args)
        start, point = ctx.start_rollout_id, ctx.resume
        if point is not None and cfg.data.start_rollout_id is None:  # the checkpoint's data position
            await asyncio.to_thread(self.data_source.load, point.rollout_id)
        elif cfg.ckpt.load and start > 0:  # --start-rollout-id: the position saved before that step
            await asyncio.to_thread(self.data_source.load, start - 1)
        self.rollout_fn = self._rollout_function()
        eval_path = cfg.eval.eval_function_path or cfg.rollout.rollout_function_path
        self.eval_fn = None if eval_path == DEFAULT_ROLLOUT else load_plugin(  # None: the Generator evaluates
            eval_path, flag="--eval-function-path" if cfg.eval.eval_function_path else "--rollout-function-path",
            positional=3, expected=EVAL_FUNCTION_SIGNATURE)
        self.reward_post_process = None
        if cfg.reward.custom_reward_post_process_path:
            self.reward_post_process = load_plugin(
                cfg.reward.custom_reward_post_process_path, flag="--custom-reward-post-process-path", positional=2,
                expected="fn(args, samples) -> (raw_rewards, rewards)")
        self.convert_samples = None
        if cfg.reward.custom_convert_samples_to_train_data_path:
            self.convert_samples = load_plugin(
                cfg.reward.custom_convert_samples_to_train_data_path,
                flag="--custom-convert-samples-to-train-data-path", positional=2,
                expected="convert_samples_to_train_data(args, samples) -> dict")
        self.eval_sets = await asyncio.to_thread(self._load_eval_sets, tokenizer)
        return dataclasses.replace(ctx, num_prompts=len(self.data_source))

    def _fleet_spec(self) -> FleetSpec:
        cfg, n, r = self.cfg, self.plan.role.workers, self.cfg.rollout
        context = engine_context_len(cfg.rollout.rollout_max_context_len, eval_datasets(cfg.args))
        external = tuple(f"http://{a}" for a in r.rollout_external_engine_addrs or ()) if r.rollout_external else ()
        if external and cfg.sglang:
            logger.warning("--sglang-* options %s configure engines Relax launches; the external engines keep the "
                           "options they were started with", sorted(cfg.sglang))
        host = f"[{r.sglang_router_ip}]" if ":" in (r.sglang_router_ip or "") else r.sglang_router_ip
        return FleetSpec(
            name="rollout", backend=cfg.cluster.rollout_backend, model_path=cfg.ckpt.hf_checkpoint, api_key=self.token,
            log_dir=cfg.misc.exp_dir or ".", threads=cfg.cluster.engine_threads or max(1, (os.cpu_count() or 1) // n),
            options=engine_options(cfg, context), startup_timeout=cfg.rollout.engine_startup_timeout,
            http_timeout=cfg.rollout.http_timeout, log_names=tuple(f"engine_{i}.log" for i in range(n)),
            # On a GPU cluster: the GPUs the engine's slots hold in the run's placement group.
            devices=tuple(self.gpu_slots.devices) if self.gpu_slots is not None else ("cpu",) * n,
            external=external, router=f"http://{host}:{r.sglang_router_port}" if host else None,
            hold_s=recovery_window_s(cfg) if cfg.fault.use_fault_tolerance else 0.0,
            generate_defaults=generate_defaults(cfg), slime_router=SlimeRouterSpec.from_config(cfg))

    def _rollout_function(self) -> Any:
        """`async fn(step, rollout_id)`: the Generator for the default rollout function, else the
        plugin (`--rollout-function-path`, or the replay of --load-debug-rollout-data)."""
        cfg = self.cfg
        path = REPLAY_ROLLOUT if cfg.debug.load_debug_rollout_data else cfg.rollout.rollout_function_path
        if path == DEFAULT_ROLLOUT:
            return lambda step, rollout_id: self.generator.rollout(step, rollout_id, self.data_source)
        fn = load_plugin(path, flag="--rollout-function-path", positional=3, expected=ROLLOUT_SIGNATURE)

        async def call(step: StepState, rollout_id: int) -> list[list[Sample]]:
            # Sync rollout functions (slime style) run in a worker thread, where they may run their own loop.
            try:
                if inspect.iscoroutinefunction(fn):
                    return await fn(self.args, rollout_id, self.data_source)
                return await asyncio.to_thread(fn, self.args, rollout_id, self.data_source)
            finally:
                step.prompts_drawn.set()

        return call

    def _load_eval_sets(self, tokenizer: Any) -> dict[str, tuple[EvalDataset, list[Sample]]]:
        from relax.utils.data.dataset import PromptDataset
        from relax.utils.data.formatting import MediaLength

        d, g = self.cfg.data, self.generator
        # Multimodal eval rows are measured as the model sees them, with the rollout's own processor.
        media_length = MediaLength(g.processor, g.pipelines) if g.processor is not None else None
        return {
            ds.name: (ds, PromptDataset(
                ds.path, tokenizer, input_key=ds.input_key, label_key=ds.label_key, metadata_key=ds.metadata_key,
                tool_key=ds.tool_key, apply_chat_template=d.apply_chat_template,
                apply_chat_template_kwargs=d.apply_chat_template_kwargs, system_prompt=d.system_prompt,
                max_prompt_len=ds.max_prompt_len, multimodal_keys=d.multimodal_keys,
                skip_malformed=d.skip_malformed_rows, media_length=media_length,
            ).samples)
            for ds in eval_datasets(self.cfg.args)
        }

    async def shutdown(self) -> None:
        self.stopping = True
        await self.stop_scaling()  # (the Controller stopped it before the roles went, unless that call failed)
        await self.fleet.stop()
        if self.gpu_slots is not None:
            self.gpu_slots.release()
        if self.added_gpus is not None:
            self.added_gpus.release_all()
        if hasattr(self, "rewards"):
            self.rewards.close()
        if getattr(self, "generator", None) is not None:
            self.generator.encoder.close()
        for _, generator in self._evaluators.values():
            if generator is not None and generator.rewards is not self.rewards:
                generator.rewards.close()
        if self.cfg.agentic.agent_function_path:
            from relax.engine.agentic.gateway import close_gateways

            await close_gateways()
        await close_sessions()

    # ---- the fleet: health (relax.core.health) and elastic scaling (relax.engine.elastic.service) ----
    async def check_engines(self, timeout: float) -> list[tuple[str, str]]:
        """(url, what is wrong) for every engine that died or did not answer its health check."""
        return await self.fleet.probe(timeout)

    async def replace_engine(self, url: str) -> str:
        """Take the failed engine out (its requests in flight go to the others), stop it and start a
        fresh one on its device; returns the new engine's URL, not yet routed to (`admit_engine`)."""
        return await self.fleet.replace(url)

    async def admit_engine(self, url: str) -> None:
        """Route to a replacement engine (it holds the current weights now)."""
        await self.fleet.admit(url)

    def requests_resent(self) -> int:
        """Generate requests sent again after their engine failed, so far."""
        return self.fleet.requests_resent()

    def weight_receivers(self) -> Receivers:
        """The engines take every weight push (a draining one no longer): their URLs, and per engine the
        GPUs it runs on (empty on CPU: a sender on one of them uses CUDA IPC)."""
        urls = [u for u in self.fleet.urls if u not in self.fleet.draining]
        if self.gpu_slots is None:
            return Receivers(urls)
        # By device, not position: a replacement engine joins the fleet last, on its predecessor's GPUs.
        identity = dict(zip(self.gpu_slots.devices, self.gpu_slots.identities))
        if self.added_gpus is not None:  # engines a scale-out added
            identity.update(self.added_gpus.identities())
        return Receivers(urls, [identity.get(self.fleet.device_of(url), ()) for url in urls])

    async def start_scaling(self, actor: Any, coordinator: Any) -> str:
        """Serve the scaling API (and --autoscaler-config's autoscaler) from this replica; its URL. Added engines
        get the weights the Actor's ranks hold through `actor` and the DCS `coordinator` (Serve handles)."""
        if self.gpu_slots is not None:  # on GPUs an added engine holds whole GPUs outside the run's placement group
            from relax.distributed.ray.elastic_gpus import ElasticGpus

            self.added_gpus = ElasticGpus(len(self.plan.role.slots[0]))
        local = LocalFleetOps(self.fleet, partial_rollout=self.cfg.rollout.partial_rollout, gpus=self.added_gpus)
        ops = RunFleetOps(local, RunWeights(actor, coordinator), self.weight_receivers)
        staleness = float(self.plan.max_staleness) if self.plan.overlapping_steps else None  # fully async: the bound
        self.scaling = ScalingService(self.cfg, ops, self.fleet_lock.lock, staleness)
        return await self.scaling.start()

    async def scaling_metrics(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """`elastic/*` of step `step`, whose metrics row `metrics` gives the autoscaler its signals."""
        return await self.scaling.step_metrics(step, metrics)

    async def stop_scaling(self) -> None:
        """No scaling operation from now on: the one in flight is rolled back (or finished), the API stops."""
        await self.scaling.stop()  # (again: nothing to do)

    async def hold_fleet(self, holder: str) -> bool:
        """Once no scaling operation runs, keep the fleet for `holder` until `free_fleet(holder)` (FleetLock)."""
        return await self.fleet_lock.hold(holder)

    async def free_fleet(self, holder: str) -> None:
        self.fleet_lock.free(holder)

    # ---- fully async ---------------------------------------------------------------------
    async def run(self, start: int, end: int) -> None:
        """Generate steps back to back, each once the staleness bound allows (the plan streams it).

        Step s may start only when every engine holds weights of version >= s - max_staleness;
        the Actor trains step s at version s, so no row it trains lags more than the bound.
        Groups stream into the step's partition as they finish. Once a step has drawn its prompts
        (`StepState.prompts_drawn`) the next one may start while its slowest samples finish, so
        the engines' batches stay full instead of draining to the longest response."""
        bound = self.plan.max_staleness
        self._busy_mark = await self._engine_busy_seconds()
        running: list[asyncio.Task] = []
        try:
            for step in range(start, end):
                wait_start = time.perf_counter()
                started_at = await self._wait_engine_version(step - bound)
                if self.stopping:
                    return
                state = StepState()
                task = asyncio.create_task(self._run_step(step, state, started_at, time.perf_counter() - wait_start))
                running.append(task)
                # The next step draws from the data source only after this one is done with it.
                drawn = asyncio.create_task(state.prompts_drawn.wait())
                await asyncio.wait([task, drawn], return_when=asyncio.FIRST_COMPLETED)
                drawn.cancel()
                if task.done():
                    task.result()  # a failed step fails the run
                self._snapshot(step, bound)
                for t in [t for t in running if t.done()]:
                    t.result()
                running = [t for t in running if not t.done()]
            await asyncio.gather(*running)
        finally:
            for t in running:
                t.cancel()

    async def _run_step(self, step: int, state: StepState, started_at: int, waited: float) -> None:
        """One streamed step in its own task (its own `StepState`), then announce it."""
        try:
            metrics = await self.generate(step, state=state, started_at=started_at)
        except BaseException as exc:  # the Actor waiting for this step hears of it
            self.failed[step] = exc
            self._event(step).set()
            raise
        metrics["rollout/staleness_wait_seconds"] = waited
        metrics["rollout/started_at_version"] = float(started_at)
        self.finished[step] = metrics
        self._event(step).set()

    def _snapshot(self, step: int, bound: int) -> None:
        """The data position right after step `step` drew its prompts (what a checkpoint of
        that step must resume from, even though later steps have drawn since)."""
        if not hasattr(self.data_source, "state_dict"):
            return
        self.snapshots[step] = copy.deepcopy(self.data_source.state_dict())
        # The Actor trains (and checkpoints) at most `bound + 1` steps behind this one.
        for old in [s for s in self.snapshots if s < step - bound - 1]:
            del self.snapshots[old]

    def _event(self, step: int) -> asyncio.Event:
        return self.step_events.setdefault(step, asyncio.Event())

    async def wait_step(self, step: int) -> dict[str, float]:
        """Wait until step `step` is generated (by `run`); its rollout metrics."""
        await self._event(step).wait()
        self.step_events.pop(step, None)
        if step in self.failed:
            exc = self.failed.pop(step)
            raise RuntimeError(f"rollout step {step} failed: {type(exc).__name__}: {exc}") from exc
        return self.finished.pop(step)

    async def engine_version(self) -> int:
        """The oldest weight version any engine holds."""
        return await self.fleet.weight_version()

    async def _wait_engine_version(self, minimum: int) -> int:
        return await self.fleet.wait_weight_version(minimum, alive=lambda: not self.stopping)

    # ---- per step ----------------------------------------------------------------------
    async def generate(self, rollout_id: int, *, state: StepState | None = None,
                       started_at: int | None = None) -> dict[str, float]:
        """Run one rollout step and write its samples to partition `train_{rollout_id}`.

        When the plan streams groups, kept groups are written as soon as they are final (the
        remaining ones, e.g. from a custom rollout function, at the end), stamped with
        `started_at` (the engines' weight version when the step started); then the step is
        marked done."""
        start = time.perf_counter()
        step = self.current = state or StepState()
        profiled = await self.profiler.start(rollout_id)
        busy_before = {} if self.plan.overlapping_steps else await self._engine_busy_seconds()
        streamed: set[int] = set()
        media = MEDIA_COLUMN in self.plan.role.writes  # a multimodal run: rows carry encoder tensors
        routing = self.generator.spec.routing  # R3: rows carry the engines' routing records
        # A reward post-process or a custom train-data conversion needs the whole step: the plan does not stream.
        if self.plan.stream_groups:
            async def sink(group: list[Sample]) -> None:
                await tq.put_samples(rollout_id, group, [self.rewards.reward_value(s) for s in group],
                                     started_at=started_at, media=media, routing=routing)
                streamed.update(s.index for s in group)
            step.group_sink = sink
        groups = await self.rollout_fn(step, rollout_id)
        step.group_sink = None
        profiled |= await self.profiler.stop(rollout_id)
        busy_after = await self._engine_busy_seconds()
        if self.plan.overlapping_steps:  # steps overlap: each reports the engine time since the last report
            # (read at the end: a step that started before the previous one ended must not count its time again)
            busy_before, self._busy_mark = self._busy_mark, busy_after
        # (an engine replaced during the step counts from its start)
        busy = [after - busy_before.get(url, 0.0) for url, after in busy_after.items()]
        if self.cfg.debug.save_debug_rollout_data:
            await asyncio.to_thread(save_rollout, self.cfg.debug.save_debug_rollout_data, rollout_id, groups)
        samples = [s for g in groups for s in g]
        if not samples:
            raise RuntimeError(f"rollout {rollout_id}: the rollout function returned no samples")
        rewards = [self.rewards.reward_value(s) for s in samples]
        if self.reward_post_process is not None:
            _, rewards = await call_maybe_async(self.reward_post_process, self.args, samples)
            rewards = [float(r) for r in rewards]
        train_data = None
        if self.convert_samples is not None:  # the step's training rows, built by the plugin
            train_data = await call_maybe_async(self.convert_samples, self.args, samples)
        rest = [i for i, s in enumerate(samples) if s.index not in streamed]
        if train_data is not None:
            await tq.put_samples(rollout_id, samples, rewards, train_data, started_at=started_at, media=media,
                                 routing=routing)
        elif rest:
            await tq.put_samples(rollout_id, [samples[i] for i in rest], [rewards[i] for i in rest],
                                 started_at=started_at, media=media, routing=routing)
        await tq.mark_step_done(rollout_id, len(samples) if train_data is not None else tq.row_count(samples))
        if self.cfg.debug.dump_details:
            await asyncio.to_thread(dump_rollout_details, self.cfg.debug.dump_details, rollout_id, groups, rewards)
        filter_stats = {k: float(v) for k, v in step.filter_stats.items()}
        if self.cfg.rollout.partial_rollout:  # aborted by a weight push, resumed on the new weights
            filter_stats |= partial_metrics(step.partial_stats)
        extra = {"compute/generate_seconds": max(busy, default=0.0), **self.rewards.stats(reset=True), **filter_stats,
                 **profiled}
        return await self.step_logs.rollout(rollout_id, samples, rewards, extra, time.perf_counter() - start)

    async def _engine_busy_seconds(self) -> dict[str, float]:
        """Per engine URL: seconds spent in batched decoding so far (0 when the backend does not say)."""
        return await self.fleet.busy_seconds()

    def progress(self) -> tuple[int, int]:
        return self.current.done, self.current.total

    async def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Run the eval function on every eval set and report reward, length and pass-rate metrics.

        Evaluation at step s runs on weights of version s: when a push may still be in flight
        (the plan overlaps pushes), wait for the engines to hold it."""
        times: dict[str, float] = {}
        sets: dict[str, EvalSet] = {}
        if self.plan.eval_waits_for_version:
            await self._wait_engine_version(rollout_id)
        for name, (dataset, prompts) in self.eval_sets.items():
            start = time.perf_counter()
            done = await self._evaluate_set(dataset, rollout_id, eval_groups(prompts, dataset))
            if not any(done):
                raise RuntimeError(f"eval {name}: the eval function returned no samples")
            sets[name] = EvalSet(done, [[s.get_reward_value(dataset.reward_key) for s in g] for g in done])
            times[f"eval/{name}/time"] = time.perf_counter() - start
        return await self.step_logs.evaluation(rollout_id, sets, times)  # statistics, pass rates, the eval hook

    def _evaluator(self, dataset: EvalDataset, num_prompts: int) -> tuple[Any, Generator]:
        """(plugin args, generator) for an eval set, built once: the dataset's sampling, reward
        and generate function; the args copy carries them for a custom eval function."""
        if dataset.name not in self._evaluators:
            args = eval_args(self.args, dataset, num_prompts)
            spec = self.rewards.spec.for_eval(dataset)
            rewards = self.rewards if spec.scorer == self.rewards.spec.scorer else RewardExecutor(spec, args)
            generator = self.generator.derive(self.generator.spec.for_eval(dataset, num_prompts), rewards, args)
            sglang_rollout.bind(args, generator)
            self._evaluators[dataset.name] = (args, generator)
        return self._evaluators[dataset.name]

    async def _evaluate_set(self, dataset: EvalDataset, rollout_id: int,
                            groups: list[list[Sample]]) -> list[list[Sample]]:
        args, generator = self._evaluator(dataset, len(groups))
        source = EvalDataSource(groups)
        if self.eval_fn is None:
            return await generator.rollout(StepState(), rollout_id, source)
        if inspect.iscoroutinefunction(self.eval_fn):
            return await self.eval_fn(args, rollout_id, source, evaluation=True)
        return await asyncio.to_thread(self.eval_fn, args, rollout_id, source, evaluation=True)

    async def release_memory(self) -> dict[str, float]:
        """Colocate: the engines free their memory while the trainer runs (the plan's offload).
        Returns the GPU memory of the rollout phase (the whole GPU's, engines at work) and what
        the engines still hold once released, where the backend reports it."""
        if not self.plan.release_memory:
            return {}
        before = await self.fleet.each(lambda c: c.get_server_info())
        await self.fleet.each(lambda c: c.release_memory_occupation())
        after = await self.fleet.each(lambda c: c.get_server_info())
        return memory_metrics({"memory/rollout_gpu_used_gib": [i.get("gpu_used_bytes") for i in before],
                               "memory/engine_released_gib": [i.get("cuda_memory_reserved") for i in after]})

    async def resume_memory(self, tags: list[str] | None = None) -> None:
        """`tags` ("weights", "kv_cache"; None = both): the weights come back before a push, the
        KV cache once the trainer has offloaded."""
        if self.plan.release_memory:
            await self.fleet.each(lambda c: c.resume_memory_occupation(tags))

    async def save(self, rollout_id: int) -> dict[str, str]:
        """Save the data position after step `rollout_id`. When steps run ahead of training, the
        snapshot taken when that step drew its prompts is written."""
        part = {"rollout": str(checkpoints.data_state_path(self.cfg.ckpt.save, rollout_id))}
        snapshot = self.snapshots.get(rollout_id)
        if snapshot is None:
            await asyncio.to_thread(self.data_source.save, rollout_id)
            return part
        current = self.data_source.state_dict()  # swap in and out within one loop turn: no get_samples between
        self.data_source.load_state_dict(snapshot)
        try:
            self.data_source.save(rollout_id)
        finally:
            self.data_source.load_state_dict(current)
        for step in [s for s in self.snapshots if s <= rollout_id]:
            del self.snapshots[step]
        return part

    async def finish_save(self) -> None:
        """The data position is written at `save` (--async-save leaves it as it is)."""


def memory_metrics(values: dict[str, list[Any]]) -> dict[str, float]:
    """Bytes per engine -> the largest engine's GiB, for the metrics the backend reported."""
    return {key: max(v for v in per_engine if v is not None) / 2**30
            for key, per_engine in values.items() if any(v is not None for v in per_engine)}
