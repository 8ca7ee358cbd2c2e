"""Rollout role: owns the inference engines, the router, the data source and the rewards.

Each step it runs the rollout function and writes the scored samples into that step's
TransferQueue partition. It also evaluates on held-out sets, releases/resumes engine memory
around training in colocate mode, and saves its data position with checkpoints. A plain
class with async methods: the Controller deploys it as a Ray Serve deployment, tests can
drive it directly.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import os
import statistics
import time
from typing import Any

from relax.backends.registry import INFERENCE_BACKENDS
from relax.config.eval_config import EvalDataset, eval_datasets
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.engine.router.router import Router
from relax.engine.rollout import sglang_rollout
from relax.engine.rollout.evaluation import EVAL_FUNCTION_SIGNATURE, EvalDataSource, eval_args, eval_groups
from relax.engine.rollout.partial_rollout import partial_metrics
from relax.engine.rollout.replay import dump_rollout_details, save_rollout
from relax.types import Sample
from relax.utils.http_utils import close_sessions
from relax.utils.metrics import pass_rates
from relax.utils.logging import run_token, setup_logging
from relax.utils.plugins import call_maybe_async, import_object, load_plugin
from relax.utils.poll import Backoff

logger = logging.getLogger(__name__)


REPLAY_ROLLOUT = "relax.engine.rollout.replay.replay_rollout"


class Rollout:
    def __init__(self, cfg: RelaxConfig) -> None:
        setup_logging()
        self.cfg = cfg
        self.token = run_token()
        self.args = cfg.args
        self.engines: list[Any] = []
        self.clients: list[Any] = []
        self.router: Router | None = None
        self.eval_sets: dict[str, tuple[EvalDataset, list[Sample]]] = {}
        # Fully async: finished steps' metrics (and an event per step), data-source snapshots
        # taken at step boundaries (checkpoints save the trained step's position, not the
        # generated one), and the engine version each step started at.
        self.finished: dict[int, dict[str, float]] = {}
        self.step_events: dict[int, asyncio.Event] = {}
        self.snapshots: dict[int, dict[str, Any]] = {}
        self.failed: dict[int, BaseException] = {}
        self._busy_mark: list[float] = []  # engines' busy seconds when the last async step reported
        self.stopping = False

    # ---- lifecycle ---------------------------------------------------------------------
    async def setup(self, start_rollout_id: int, genrm_url: str | None = None) -> dict[str, Any]:
        """Launch engines, start the router, build the data source (resuming its position).
        `genrm_url`: the GenRM role's router, for `--rm-type genrm` (set before rewards are built)."""
        tq.attach()
        self.args.genrm_url = genrm_url
        if not self.cfg.debug.debug_train_only:  # replaying saved rollouts needs no engines
            await self._start_engines()
        data_source_cls = import_object(self.args.data_source_path, flag="--data-source-path")
        self.data_source = await asyncio.to_thread(data_source_cls, self.args)
        if self.args.load and start_rollout_id > 0:
            await asyncio.to_thread(self.data_source.load, start_rollout_id - 1)
        rollout_fn_path = REPLAY_ROLLOUT if self.cfg.debug.load_debug_rollout_data else self.args.rollout_function_path
        self.rollout_fn = load_plugin(rollout_fn_path, flag="--rollout-function-path",
                                      positional=3, expected="generate_rollout(args, rollout_id, data_source, "
                                      "evaluation=False)")
        self.eval_fn = load_plugin(
            self.args.eval_function_path or self.args.rollout_function_path,
            flag="--eval-function-path" if self.args.eval_function_path else "--rollout-function-path",
            positional=3, expected=EVAL_FUNCTION_SIGNATURE)
        await asyncio.to_thread(sglang_rollout.GenerateState, self.args)
        self.reward_post_process = None
        if self.args.custom_reward_post_process_path:
            self.reward_post_process = load_plugin(
                self.args.custom_reward_post_process_path, flag="--custom-reward-post-process-path", positional=2,
                expected="fn(args, samples) -> (raw_rewards, rewards)")
        self.convert_samples = None
        if self.args.custom_convert_samples_to_train_data_path:
            self.convert_samples = load_plugin(
                self.args.custom_convert_samples_to_train_data_path, flag="--custom-convert-samples-to-train-data-path",
                positional=2, expected="convert_samples_to_train_data(args, samples) -> dict")
        self.eval_sets = await asyncio.to_thread(self._load_eval_sets)
        return {"engine_urls": [e.url for e in self.engines], "num_prompts": len(self.data_source)}

    async def _start_engines(self) -> None:
        from relax.backends.engine_client import EngineClient

        # Launched from this (the replica's long-lived event-loop) thread: an engine's
        # parent-death signal fires when the launching *thread* exits.
        self.engines = self._launch_engines()
        await asyncio.gather(*(asyncio.to_thread(e.wait_ready, self.cfg.rollout.engine_startup_timeout)
                               for e in self.engines))
        self.clients = [EngineClient(e.url, api_key=self.token) for e in self.engines]
        self.router = Router([e.url for e in self.engines], api_key=self.token,
                             timeout_s=self.cfg.rollout.http_timeout)
        await self.router.start()
        self.args.sglang_router_ip, self.args.sglang_router_port = self.router.host, self.router.port

    def _launch_engines(self) -> list[Any]:
        launch = import_object(INFERENCE_BACKENDS[self.cfg.cluster.rollout_backend], flag="--rollout-backend")
        n = self.cfg.cluster.resource["rollout"][1]
        threads = self.cfg.cluster.engine_threads or max(1, (os.cpu_count() or 1) // n)
        context = engine_context_len(self.cfg.rollout.rollout_max_context_len, eval_datasets(self.args))
        return [launch(self.cfg.ckpt.hf_checkpoint, api_key=self.token, num_threads=threads,
                       log_path=os.path.join(self.cfg.misc.exp_dir or ".", f"engine_{i}.log"),
                       options=engine_options(self.cfg, context), device=engine_device(i))
                for i in range(n)]

    def _load_eval_sets(self) -> dict[str, tuple[EvalDataset, list[Sample]]]:
        from relax.utils.data.dataset import PromptDataset

        a, tokenizer = self.args, sglang_rollout.GenerateState(self.args).tokenizer
        return {
            d.name: (d, PromptDataset(
                d.path, tokenizer, input_key=d.input_key, label_key=d.label_key, metadata_key=d.metadata_key,
                tool_key=d.tool_key, apply_chat_template=a.apply_chat_template,
                apply_chat_template_kwargs=a.apply_chat_template_kwargs, system_prompt=a.system_prompt,
                max_prompt_len=d.max_prompt_len, multimodal_keys=a.multimodal_keys,
                skip_malformed=a.skip_malformed_rows,
            ).samples)
            for d in eval_datasets(a)
        }

    async def shutdown(self) -> None:
        self.stopping = True
        if self.router is not None:
            await self.router.stop()
        for client in self.clients:
            await client.close()
        for engine in self.engines:
            engine.terminate()
        sglang_rollout.GenerateState.reset()
        await close_sessions()
        self.engines, self.clients = [], []

    def engine_urls(self) -> list[str]:
        return [e.url for e in self.engines]

    # ---- fully async ---------------------------------------------------------------------
    async def run(self, start: int, end: int) -> None:
        """Fully-async loop: generate steps back to back, each once the staleness bound allows.

        Step s may start only when every engine holds weights of version >= s - max_staleness;
        the Actor trains step s at version s, so no row it trains lags more than the bound.
        Groups stream into the step's partition as they finish. Once a step has drawn its prompts
        (`StepState.prompts_drawn`) the next one may start while its slowest samples finish, so
        the engines' batches stay full instead of draining to the longest response."""
        bound = self.cfg.cluster.max_staleness
        self._busy_mark = await self._engine_busy_seconds()
        running: list[asyncio.Task] = []
        try:
            for step in range(start, end):
                wait_start = time.perf_counter()
                started_at = await self._wait_engine_version(step - bound)
                if self.stopping:
                    return
                state = sglang_rollout.StepState()
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

    async def _run_step(self, step: int, state: Any, started_at: int, waited: float) -> None:
        """One fully-async step in its own task (its own `StepState`), then announce it."""
        sglang_rollout.enter_step(state)
        try:
            metrics = await self.generate(step, started_at=started_at)
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
        """Fully async: wait until step `step` is generated; its rollout metrics."""
        await self._event(step).wait()
        self.step_events.pop(step, None)
        if step in self.failed:
            exc = self.failed.pop(step)
            raise RuntimeError(f"rollout step {step} failed: {type(exc).__name__}: {exc}") from exc
        return self.finished.pop(step)

    async def engine_version(self) -> int:
        """The oldest weight version any engine holds."""
        versions = await asyncio.gather(*(c.get_weight_version() for c in self.clients))
        return min(sglang_rollout.parse_weight_version(v) for v in versions)

    async def _wait_engine_version(self, minimum: int) -> int:
        if not self.clients:  # replay: no engines; the Actor's version stands for theirs
            return max(minimum, 0)
        backoff = Backoff(max_s=0.05)  # each poll is an HTTP call to every engine
        while not self.stopping:
            version = await self.engine_version()
            if version >= minimum:
                return version
            await backoff.wait()
        return minimum

    # ---- per step ----------------------------------------------------------------------
    async def generate(self, rollout_id: int, *, started_at: int | None = None) -> dict[str, float]:
        """Run one rollout step and write its samples to partition `train_{rollout_id}`.

        In fully-async mode kept groups are written as soon as they are final (the remaining
        ones, e.g. from a custom rollout function, at the end), stamped with `started_at` (the
        engines' weight version when the step started); then the step is marked done."""
        start = time.perf_counter()
        busy_before = [] if self.cfg.cluster.fully_async else await self._engine_busy_seconds()
        state = sglang_rollout.GenerateState(self.args)
        step = state.step
        streamed: set[int] = set()
        # A reward post-process or a custom train-data conversion needs the whole step: no streaming.
        if self.cfg.cluster.fully_async and self.reward_post_process is None and self.convert_samples is None:
            async def sink(group: list[Sample]) -> None:
                await tq.put_samples(rollout_id, group, [state.reward_executor.reward_value(s) for s in group],
                                     started_at=started_at)
                streamed.update(s.index for s in group)
            step.group_sink = sink
        try:
            groups = await self._call_rollout_fn(rollout_id)
        finally:
            step.group_sink = None
        busy_after = await self._engine_busy_seconds()
        if self.cfg.cluster.fully_async:  # steps overlap: each reports the engine time since the last report
            busy_before, self._busy_mark = self._busy_mark, busy_after
        busy = [after - before for before, after in zip(busy_before, busy_after)]
        if self.cfg.debug.save_debug_rollout_data:
            await asyncio.to_thread(save_rollout, self.cfg.debug.save_debug_rollout_data, rollout_id, groups)
        samples = [s for g in groups for s in g]
        if not samples:
            raise RuntimeError(f"rollout {rollout_id}: the rollout function returned no samples")
        executor = state.reward_executor
        rewards = [executor.reward_value(s) for s in samples]
        if self.reward_post_process is not None:
            _, rewards = await call_maybe_async(self.reward_post_process, self.args, samples)
            rewards = [float(r) for r in rewards]
        train_data = None
        if self.convert_samples is not None:  # the step's training rows, built by the plugin
            train_data = await call_maybe_async(self.convert_samples, self.args, samples)
        rest = [i for i, s in enumerate(samples) if s.index not in streamed]
        if train_data is not None:
            await tq.put_samples(rollout_id, samples, rewards, train_data, started_at=started_at)
        elif rest:
            await tq.put_samples(rollout_id, [samples[i] for i in rest], [rewards[i] for i in rest],
                                 started_at=started_at)
        await tq.mark_step_done(rollout_id, len(samples))
        if self.cfg.debug.dump_details:
            await asyncio.to_thread(dump_rollout_details, self.cfg.debug.dump_details, rollout_id, groups, rewards)
        filter_stats = {k: float(v) for k, v in step.filter_stats.items()}
        step.filter_stats.clear()
        if self.cfg.rollout.partial_rollout:  # aborted by a weight push, resumed on the new weights
            filter_stats |= partial_metrics(step.partial_stats)
        return rollout_metrics(samples, rewards, prefix="rollout") | {
            "time/rollout": time.perf_counter() - start, "compute/generate_seconds": max(busy, default=0.0),
            **executor.stats(reset=True), **filter_stats}

    async def _engine_busy_seconds(self) -> list[float]:
        """Per engine: seconds spent in batched decoding so far (0 when the backend does not say)."""
        infos = await asyncio.gather(*(c.get_server_info() for c in self.clients))
        return [float(info.get("busy_seconds", 0.0)) for info in infos]

    async def _call_rollout_fn(self, rollout_id: int) -> list[list[Sample]]:
        """Async rollout functions run on this loop; sync ones (slime style) in a worker thread,
        where they may run their own event loop."""
        if inspect.iscoroutinefunction(self.rollout_fn):
            return await self.rollout_fn(self.args, rollout_id, self.data_source)
        return await asyncio.to_thread(self.rollout_fn, self.args, rollout_id, self.data_source)

    def progress(self) -> tuple[int, int]:
        step = sglang_rollout.GenerateState(self.args).step  # colocate: one step at a time, the default
        return step.done, step.total

    async def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Run the eval function on every eval set and report reward, length and pass-rate metrics.

        Evaluation at step s runs on weights of version s: in fully-async mode the Actor's push
        may still be in flight, so wait for the engines to hold it."""
        metrics: dict[str, float] = {}
        if self.cfg.cluster.fully_async and not self.cfg.debug.debug_rollout_only:
            await self._wait_engine_version(rollout_id)
        for name, (dataset, prompts) in self.eval_sets.items():
            start = time.perf_counter()
            groups = eval_groups(prompts, dataset)
            args = eval_args(self.args, dataset, len(groups))
            done = await self._call_eval_fn(args, rollout_id, EvalDataSource(groups))
            samples = [s for g in done for s in g]
            if not samples:
                raise RuntimeError(f"eval {name}: the eval function returned no samples")
            rewards = [s.get_reward_value(dataset.reward_key) for s in samples]
            metrics.update(rollout_metrics(samples, rewards, prefix=f"eval/{name}"))
            if self.cfg.logging.log_passrate:  # a sample counts as correct when its reward is > 0
                correct = [[s.get_reward_value(dataset.reward_key) > 0 for s in g] for g in done]
                metrics.update(pass_rates(correct, prefix=f"eval/{name}"))
            metrics[f"eval/{name}/time"] = time.perf_counter() - start
        return metrics

    async def _call_eval_fn(self, args: Any, rollout_id: int, data_source: EvalDataSource) -> list[list[Sample]]:
        if inspect.iscoroutinefunction(self.eval_fn):
            return await self.eval_fn(args, rollout_id, data_source, evaluation=True)
        return await asyncio.to_thread(self.eval_fn, args, rollout_id, data_source, evaluation=True)

    async def release_memory(self) -> None:
        await asyncio.gather(*(c.release_memory_occupation() for c in self.clients))

    async def resume_memory(self) -> None:
        await asyncio.gather(*(c.resume_memory_occupation() for c in self.clients))

    async def save(self, rollout_id: int) -> None:
        """Save the data position after step `rollout_id`. In fully-async mode generation is
        ahead of training, so the snapshot taken when that step finished is written."""
        snapshot = self.snapshots.get(rollout_id)
        if snapshot is None:
            await asyncio.to_thread(self.data_source.save, rollout_id)
            return
        current = self.data_source.state_dict()  # swap in and out within one loop turn: no get_samples between
        self.data_source.load_state_dict(snapshot)
        try:
            self.data_source.save(rollout_id)
        finally:
            self.data_source.load_state_dict(current)
        for step in [s for s in self.snapshots if s <= rollout_id]:
            del self.snapshots[step]


def engine_device(index: int) -> str:
    """Engine `index`'s device: on a GPU cluster the Rollout replica holds one GPU per engine
    (`rollout_gpus`; Ray sets its CUDA_VISIBLE_DEVICES, which the engine processes inherit)."""
    import torch

    return f"cuda:{index}" if torch.cuda.is_available() else "cpu"


def rollout_gpus(cfg: RelaxConfig, cluster_gpus: float) -> int:
    """GPUs the Rollout replica reserves for its engines: one per engine (`--resource`'s rollout
    entry) on a cluster with GPUs, none on a CPU cluster."""
    return cfg.cluster.resource["rollout"][1] if cluster_gpus > 0 else 0


def engine_options(cfg: RelaxConfig, context_len: int | None) -> dict[str, Any] | None:
    """Launch options of the rollout engines (SGLang `ServerArgs` names; see ENGINE_OPTIONS)."""
    # --sglang-<option> passthrough: what this backend understands goes to the engines.
    known = import_object("relax.backends.hf.launcher.ENGINE_OPTIONS", flag="--rollout-backend") \
        if cfg.cluster.rollout_backend == "hf" else None
    options: dict[str, Any] = {k: v for k, v in cfg.sglang.items() if known is None or k in known}
    ignored = sorted(set(cfg.sglang) - set(options))
    if ignored:
        logger.info("--sglang-* options the %s engine does not use: %s", cfg.cluster.rollout_backend, ignored)
    if context_len:
        options["max_context_len"] = context_len
    if cfg.cluster.true_on_policy_mode:
        # Report log-probs with the fsdp trainer's numerics, on the trainer's float32 weights.
        options.update(rl_on_policy_target="fsdp", dtype="float32")
    return options or None


def engine_context_len(rollout_limit: int | None, datasets: list[EvalDataset]) -> int | None:
    """The engines' context length: the largest limit any request may use (None: the model's own),
    since each request is cut to its own limit before it is sent."""
    limits = [rollout_limit] + [d.max_context_len for d in datasets]
    if rollout_limit is None:  # training requests are unlimited: the engine keeps the model's limit
        return None
    return max(v for v in limits if v is not None)


def rollout_metrics(samples: list[Sample], rewards: list[float], *, prefix: str) -> dict[str, float]:
    lengths = [s.response_length for s in samples]
    versions = [v for s in samples for v in s.weight_versions]
    return {
        f"{prefix}/reward_mean": statistics.fmean(rewards),
        f"{prefix}/response_len_mean": statistics.fmean(lengths),
        f"{prefix}/truncated_frac": sum(s.status == Sample.Status.TRUNCATED for s in samples) / len(samples),
        f"{prefix}/num_samples": float(len(samples)),
        f"{prefix}/weight_version_min": float(min(versions)) if versions else -1.0,
    }
