"""OPD teacher role (`--use-opd`): writes `teacher_log_probs` onto every row of a step.

The Actor subtracts `--opd-kl-coef * (logp_student - logp_teacher)` from each response
token's advantage (`relax.algorithms.advantages.apply_opd_penalty`) and reports the student's
KL to the teacher as `opd/kl_to_teacher`. Where the teacher runs is `--opd-type`, one entry
of `TEACHERS`:

    megatron  the training backend loads --opd-teacher-load as a forward-only worker group
              (like the Reference) and scores at the rollout temperature; with
              --opd-teacher-ckpt-step N it loads step N of a Relax checkpoint directory instead;
    sglang    an inference engine scores the rows over SGLang's /generate protocol
              (`input_ids`, `max_new_tokens: 0`, `return_logprob`, `logprob_start_len: 0`,
              reading `meta_info.input_token_logprobs`, i.e. raw logits at temperature 1). The
              engine is launched from --opd-teacher-load with --rollout-backend, or is an
              external SGLang server at --rm-url (slime's convention).

A teacher engine Relax launched is watched like the Rollout's with `--use-fault-tolerance`
(`relax.core.health`): a dead or hung one is replaced by a fresh engine from the same checkpoint
and its scoring requests in flight are sent again; an external one (--rm-url) is not watched.

The teacher must share the student's tokenizer: rows are scored token for token. In
fully-async plan `run` streams over each step's rows as Rollout writes them, like the Reference.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Protocol

from relax.distributed.engine_client import EngineClient
from relax.components.actor_fwd import stream_steps
from relax.components.step_advantages import jagged
from relax.components.setup_context import SetupContext
from relax.components.training import make_trainer_group, read_rows, score_rows
from relax.config.fault import recovery_window_s
from relax.config.plan import RolePlan
from relax.config.schema import RelaxConfig
from relax.distributed import transfer_queue as tq
from relax.engine.fleet import EngineFleet, FleetSpec
from relax.utils import checkpoints
from relax.utils.logging import run_token

logger = logging.getLogger(__name__)

ROWS_PER_REQUEST = 64


class TeacherScorer(Protocol):
    async def wait_ready(self) -> None: ...
    async def score(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]: ...
    async def move(self, to_host: bool) -> dict[str, float]: ...  # colocate offload / onload
    async def close(self) -> None: ...


def teacher_step(cfg: RelaxConfig) -> Path | None:
    """--opd-teacher-ckpt-step: the checkpoint step under --opd-teacher-load whose weights the teacher
    loads over --hf-checkpoint's model (None: --opd-teacher-load is an HF directory)."""
    a = cfg.algo
    if a.opd_teacher_ckpt_step is None:
        return None
    return checkpoints.step_checkpoint(a.opd_teacher_load, a.opd_teacher_ckpt_step, flag="--opd-teacher-load",
                                       step_flag="--opd-teacher-ckpt-step")


class WorkerTeacher:
    """`--opd-type megatron`: the teacher checkpoint in the training backend, forward only: the HF
    model --opd-teacher-load names, or with --opd-teacher-ckpt-step that step of the checkpoint
    directory it names (a run of --hf-checkpoint's model, whose weights load over it)."""

    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        self.step = teacher_step(cfg)
        model = cfg.algo.opd_teacher_load if self.step is None else cfg.ckpt.hf_checkpoint
        self.group = make_trainer_group(cfg, plan, model, trainable=False)

    async def wait_ready(self) -> None:
        """The workers load the HF model in their constructors; a checkpoint step's weights then."""
        if self.step is not None:
            await self.group.load_weights(str(self.step))
            logger.info("the OPD teacher loaded the weights of %s", self.step)

    async def score(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]:
        logps, _ = await score_rows(self.group, tokens, lengths)
        return logps

    async def move(self, to_host: bool) -> dict[str, float]:
        return await self.group.move(to_host)

    async def close(self) -> None:
        await self.group.shutdown()


def response_logprobs(reply: dict[str, Any], response_length: int) -> list[float]:
    """The last `response_length` input-token logprobs of a /generate reply (SGLang's
    `meta_info.input_token_logprobs`: `[logprob, token_id, text]`, logprob None at position 0)."""
    if response_length == 0:
        return []
    entries = (reply.get("meta_info") or {}).get("input_token_logprobs")
    if not entries or len(entries) <= response_length:
        raise ValueError(f"the OPD teacher engine returned {len(entries or [])} input-token logprobs for a response "
                         f"of {response_length} tokens; it must support return_logprob with logprob_start_len 0")
    return [float(lp) for lp, _tok, *_ in entries[-response_length:]]


class EngineTeacher:
    """`--opd-type sglang`: the teacher on an inference engine, reached over HTTP."""

    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        self.cfg, self.plan, self.fleet = cfg, plan, None
        self.gpu_slots: Any = None
        if cfg.rollout.rollout_temperature != 1.0:
            logger.warning("--opd-type sglang: the engine's input-token logprobs are at temperature 1, the "
                           "student's at --rollout-temperature %s; the KL compares different temperatures",
                           cfg.rollout.rollout_temperature)
        self.client: EngineClient | None = None

    async def wait_ready(self) -> None:
        """Launch the teacher engine from --opd-teacher-load (or use the external one at --rm-url)."""
        cfg, api_key = self.cfg, None
        if self.plan.workers:  # our own engine from the teacher checkpoint
            from relax.distributed.ray.placement import engine_gpus

            api_key = run_token()
            self.gpu_slots = await asyncio.to_thread(engine_gpus, self.plan)  # GPU clusters: its GPUs
            self.fleet = EngineFleet(FleetSpec(
                name="teacher", backend=cfg.cluster.rollout_backend, model_path=cfg.algo.opd_teacher_load,
                api_key=api_key, log_dir=cfg.misc.exp_dir or ".", threads=cfg.cluster.engine_threads or 1,
                startup_timeout=cfg.rollout.engine_startup_timeout, http_timeout=cfg.rollout.http_timeout,
                log_names=("teacher_engine.log",) if self.plan.workers == 1 else (),
                devices=tuple(self.gpu_slots.devices) if self.gpu_slots else (),
                hold_s=recovery_window_s(cfg) if cfg.fault.use_fault_tolerance else 0.0))
            await self.fleet.start(self.plan.workers)
            url = self.fleet.router_url
        else:
            url = cfg.reward.rm_url.removesuffix("/generate")
        self.client = EngineClient(url, api_key=api_key, timeout=cfg.rollout.http_timeout)

    async def score(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(tokens), ROWS_PER_REQUEST):
            chunk = tokens[start:start + ROWS_PER_REQUEST]
            replies = await self.client.generate({
                "input_ids": chunk, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 0}}, timeout=self.cfg.rollout.http_timeout)
            out += [response_logprobs(r, n) for r, n in zip(replies, lengths[start:start + ROWS_PER_REQUEST])]
        return out

    async def move(self, to_host: bool) -> dict[str, float]:
        """An engine keeps its memory (no trainer state to move)."""
        return {}

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.fleet is not None:
            await self.fleet.stop()
        if self.gpu_slots is not None:
            self.gpu_slots.release()


TEACHERS: dict[str, type] = {"megatron": WorkerTeacher, "sglang": EngineTeacher}


class Teacher:
    def __init__(self, cfg: RelaxConfig, plan: RolePlan) -> None:
        tq.start_replica()
        self.cfg, self.plan = cfg, plan
        self.scorer: TeacherScorer | None = None

    async def start(self) -> None:
        # Launched from this (the replica's long-lived event-loop) thread: an engine's
        # parent-death signal fires when the launching thread exits.
        self.scorer = TEACHERS[self.cfg.algo.opd_type](self.cfg, self.plan)
        await self.scorer.wait_ready()

    async def setup(self, ctx: SetupContext) -> SetupContext:
        if self.scorer is None:  # an external teacher (--rm-url): nothing was started
            await self.start()
        return ctx

    async def forward(self, rollout_id: int) -> dict[str, float]:
        start = time.perf_counter()
        keys, tokens, lengths, _ = await read_rows(rollout_id)
        logps = await self.scorer.score(tokens, lengths)
        await tq.put_columns(rollout_id, keys, {"teacher_log_probs": jagged(logps)})
        return {"time/teacher": time.perf_counter() - start}

    async def run(self, start: int, end: int) -> None:
        """Fully async: score rows of steps `start..end-1` as Rollout writes them."""
        async def score(step: int, keys: list[str], cols: dict[str, Any]) -> None:
            logps = await self.scorer.score([t.tolist() for t in cols["tokens"]],
                                            [int(x) for x in cols["response_lengths"]])
            await tq.put_columns(step, keys, {"teacher_log_probs": tq.sequence_column(logps)})

        await stream_steps(start, end, task="teacher", chunk=self.cfg.rollout.n_samples_per_prompt,
                           fields=["tokens", "response_lengths"], score=score, alive=lambda: self.scorer is not None)

    async def offload(self) -> dict[str, float]:
        """Colocate on shared GPUs: a training-backend teacher's ranks go to the host during rollout."""
        return await self.scorer.move(to_host=True)

    async def onload(self) -> dict[str, float]:
        return await self.scorer.move(to_host=False)

    # ---- health (relax.core.health drives these; a teacher engine Relax launched) ---------------
    def _fleet(self) -> EngineFleet | None:
        return getattr(self.scorer, "fleet", None)

    async def check_engines(self, timeout: float) -> list[tuple[str, str]]:
        """(url, what is wrong) for every teacher engine that died or did not answer its health check."""
        fleet = self._fleet()
        return await fleet.probe(timeout) if fleet else []

    async def replace_engine(self, url: str) -> str:
        """A fresh teacher engine from --opd-teacher-load in place of the failed one at `url`; returns its
        URL, not yet routed to (`admit_engine`)."""
        return await self._fleet().replace(url)

    async def admit_engine(self, url: str) -> None:
        await self._fleet().admit(url)

    def requests_resent(self) -> int:
        """Scoring requests sent again after their engine failed, so far."""
        fleet = self._fleet()
        return fleet.requests_resent() if fleet else 0

    async def shutdown(self) -> None:
        if self.scorer is not None:
            await self.scorer.close()
            self.scorer = None
