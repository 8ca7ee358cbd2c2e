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
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.engine.router.router import Router
from relax.engine.rollout import sglang_rollout
from relax.engine.rollout.replay import dump_rollout_details, save_rollout
from relax.types import Sample
from relax.utils.http_utils import close_sessions
from relax.utils.metrics import pass_rates
from relax.utils.logging import run_token, setup_logging
from relax.utils.plugins import call_maybe_async, import_object, load_plugin

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
        self.eval_sets: dict[str, list[Sample]] = {}

    # ---- lifecycle ---------------------------------------------------------------------
    async def setup(self, start_rollout_id: int) -> dict[str, Any]:
        """Launch engines, start the router, build the data source (resuming its position)."""
        tq.attach()
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
        return [launch(self.cfg.ckpt.hf_checkpoint, api_key=self.token, num_threads=threads,
                       log_path=os.path.join(self.cfg.misc.exp_dir or ".", f"engine_{i}.log"))
                for i in range(n)]

    def _load_eval_sets(self) -> dict[str, list[Sample]]:
        from relax.utils.data.dataset import PromptDataset

        a, tokenizer = self.args, sglang_rollout.GenerateState(self.args).tokenizer
        ev = self.cfg.eval.eval_prompt_data or []
        return {
            name: PromptDataset(
                path, tokenizer, input_key=a.eval_input_key or a.input_key, label_key=a.eval_label_key or a.label_key,
                metadata_key=a.metadata_key, tool_key=a.eval_tool_key or a.tool_key,
                apply_chat_template=a.apply_chat_template, apply_chat_template_kwargs=a.apply_chat_template_kwargs,
                system_prompt=a.system_prompt, max_prompt_len=a.eval_max_prompt_len,
                multimodal_keys=a.multimodal_keys, skip_malformed=a.skip_malformed_rows,
            ).samples
            for name, path in zip(ev[::2], ev[1::2])
        }

    async def shutdown(self) -> None:
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

    # ---- per step ----------------------------------------------------------------------
    async def generate(self, rollout_id: int) -> dict[str, float]:
        """Run one rollout step and write its samples to partition `train_{rollout_id}`."""
        start = time.perf_counter()
        busy_before = await self._engine_busy_seconds()
        groups = await self._call_rollout_fn(rollout_id)
        busy = [after - before for before, after in zip(busy_before, await self._engine_busy_seconds())]
        if self.cfg.debug.save_debug_rollout_data:
            await asyncio.to_thread(save_rollout, self.cfg.debug.save_debug_rollout_data, rollout_id, groups)
        samples = [s for g in groups for s in g]
        if not samples:
            raise RuntimeError(f"rollout {rollout_id}: the rollout function returned no samples")
        state = sglang_rollout.GenerateState(self.args)
        executor = state.reward_executor
        rewards = [executor.reward_value(s) for s in samples]
        if self.reward_post_process is not None:
            _, rewards = await call_maybe_async(self.reward_post_process, self.args, samples)
            rewards = [float(r) for r in rewards]
        train_data = None
        if self.convert_samples is not None:  # the step's training rows, built by the plugin
            train_data = await call_maybe_async(self.convert_samples, self.args, samples)
        await tq.put_samples(rollout_id, samples, rewards, train_data)
        if self.cfg.debug.dump_details:
            await asyncio.to_thread(dump_rollout_details, self.cfg.debug.dump_details, rollout_id, groups, rewards)
        filter_stats = {k: float(v) for k, v in state.filter_stats.items()}
        state.filter_stats.clear()
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
        state = sglang_rollout.GenerateState(self.args)
        return state.done, state.total

    async def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Generate on every eval set (n samples per prompt) and report the mean reward."""
        metrics: dict[str, float] = {}
        executor = sglang_rollout.GenerateState(self.args).reward_executor
        n = self.cfg.eval.n_samples_per_eval_prompt
        for name, prompts in self.eval_sets.items():
            start = time.perf_counter()
            groups = []
            for p, prompt in enumerate(prompts):
                group = []
                for j in range(n):
                    s = copy.deepcopy(prompt)
                    s.index, s.group_index = p * n + j, p
                    group.append(s)
                groups.append(group)
            done = await asyncio.gather(*(sglang_rollout.generate_group(self.args, g, evaluation=True) for g in groups))
            samples = [s for g in done for s in g]
            rewards = [executor.reward_value(s) for s in samples]
            metrics.update(rollout_metrics(samples, rewards, prefix=f"eval/{name}"))
            if self.cfg.logging.log_passrate:  # a sample counts as correct when its reward is > 0
                correct = [[executor.reward_value(s) > 0 for s in g] for g in done]
                metrics.update(pass_rates(correct, prefix=f"eval/{name}"))
            metrics[f"eval/{name}/time"] = time.perf_counter() - start
        return metrics

    async def release_memory(self) -> None:
        await asyncio.gather(*(c.release_memory_occupation() for c in self.clients))

    async def resume_memory(self) -> None:
        await asyncio.gather(*(c.resume_memory_occupation() for c in self.clients))

    async def save(self, rollout_id: int) -> None:
        await asyncio.to_thread(self.data_source.save, rollout_id)


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
