"""The hf engine's torch profiler, behind SGLang's `/start_profile` and `/stop_profile`.

SGLang profiles a running server on request: `POST /start_profile` with its `ProfileReq` fields
(`output_dir`, `num_steps`, `activities`, `with_stack`, `record_shapes`, `profile_prefix`,
`profile_id`, ...) starts torch.profiler; after `num_steps` forward steps, or at `POST /stop_profile`,
the trace is written as `<output_dir>/<profile_prefix>-<profile_id>-TP-0.trace.json.gz` (a Chrome
trace: Perfetto or chrome://tracing open it). This engine does the same over its decode loop, so
`--sglang-profile` (`relax.engine.rollout.profiling`) works on either backend.

torch.profiler records the ops of the thread that starts it, and the model runs in the scheduler's
one decode thread, so every start and stop happens there: a request is queued, the decode thread
takes it at its next step boundary (`Scheduler.step_hook`), or at once in a job on that thread when
the engine is idle (`Scheduler.on_decode_thread`), and the HTTP reply waits for the outcome. A step
is one pass of the decode loop (the prefill of rows joining it included). Activities: CPU; GPU (CUDA
kernels, on a GPU engine); MEM (torch's `profile_memory`). SGLang's `profile_by_stage`, `start_step`,
`merge_profiles` and `profile_stages` have no counterpart here (prefill runs inside the continuously
batched steps): a request that sets one gets HTTP 400 saying so, as does a second start while one
runs or a stop with none running (SGLang's messages).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import time
from dataclasses import dataclass
from typing import Annotated, Any, Callable

from fastapi import Body, FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

logger = logging.getLogger(__name__)

ACTIVITIES = ("CPU", "GPU", "MEM")
NOT_RUNNING = "Profiling is not in progress. Call /start_profile first."
RUNNING = "Profiling is already in progress. Call /stop_profile first."


class ProfileRequest(BaseModel):
    """SGLang's `ProfileReq` (io_struct.py, 0.5.23), field for field."""

    model_config = ConfigDict(extra="forbid")

    output_dir: StrictStr | None = None
    start_step: StrictInt | None = None
    num_steps: StrictInt | None = Field(default=None, ge=1)
    activities: list[StrictStr] | None = None
    profile_by_stage: StrictBool = False
    with_stack: StrictBool | None = None
    record_shapes: StrictBool | None = None
    profile_id: StrictStr | None = None
    merge_profiles: StrictBool = False
    profile_prefix: StrictStr | None = None
    profile_stages: list[StrictStr] | None = None
    detailed_annotations: StrictBool = False


@dataclass(frozen=True)
class ProfilePlan:
    """One profile: what torch.profiler records, for how many steps (None: until stopped), where."""

    path: str
    num_steps: int | None
    cpu: bool
    gpu: bool
    memory: bool
    with_stack: bool
    record_shapes: bool


def plan_profile(req: ProfileRequest, device_type: str) -> ProfilePlan:
    """The plan of a /start_profile request on an engine on `device_type`; ValueError saying what
    this engine cannot do."""
    unsupported = [name for name, value in (("profile_by_stage", req.profile_by_stage), ("start_step", req.start_step),
                                            ("merge_profiles", req.merge_profiles),
                                            ("profile_stages", req.profile_stages)) if value]
    if unsupported:
        raise ValueError(f"{', '.join(unsupported)}: the hf engine records one trace over its continuously batched "
                         "decode steps (prefill runs inside them); leave them unset")
    activities = req.activities or ["CPU", "GPU"]
    unknown = [a for a in activities if a not in ACTIVITIES]
    if unknown:
        raise ValueError(f"activities {unknown}: the hf engine records {', '.join(ACTIVITIES)}")
    cpu, gpu = "CPU" in activities, "GPU" in activities and device_type == "cuda"
    if not (cpu or gpu):
        raise ValueError(f"activities {activities}: this engine runs on {device_type}, so there is nothing to record; "
                         "add CPU")
    prefix = f"{req.profile_prefix}-" if req.profile_prefix else ""
    directory = req.output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
    name = f"{prefix}{req.profile_id or time.time()}-TP-0.trace.json.gz"
    return ProfilePlan(path=os.path.join(directory, name), num_steps=req.num_steps, cpu=cpu, gpu=gpu,
                       memory="MEM" in activities, with_stack=req.with_stack is not False,
                       record_shapes=req.record_shapes is not False)


class EngineProfiler:
    """Runs torch.profiler on the decode thread (module doc). `scheduler`: the engine's `Scheduler`,
    whose `step_hook` this takes."""

    def __init__(self, scheduler: Any, device_type: str) -> None:
        self.scheduler, self.device_type = scheduler, device_type
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # (plan or None for a stop, reply future)
        self._profile: Any = None  # the torch.profiler.profile recording now (decode thread only)
        self._plan: ProfilePlan | None = None
        self._steps_left: int | None = None
        scheduler.step_hook = self.tick

    async def start(self, req: ProfileRequest) -> str:
        return await self._submit(plan_profile(req, self.device_type))

    async def stop(self) -> str:
        return await self._submit(None)

    async def _submit(self, plan: ProfilePlan | None) -> str:
        """Queue a start (`plan`) or a stop (None) for the decode thread; its message, or ValueError."""
        reply: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put((plan, reply))
        self.scheduler.on_decode_thread(lambda: self.tick(False))  # idle: now; busy: the next step takes it
        ok, message = await asyncio.wrap_future(reply)
        if not ok:
            raise ValueError(message)
        return message

    def tick(self, step: bool) -> None:
        """On the decode thread: take queued requests, then count a step (`step`) or end a profile
        whose steps are done."""
        while True:
            try:
                plan, reply = self._requests.get_nowait()
            except queue.Empty:
                break
            reply.set_result(self._begin(plan) if plan is not None else self._end())
        if self._profile is not None and self._steps_left is not None:
            if self._steps_left == 0:
                self._end()
            elif step:
                self._steps_left -= 1

    def _begin(self, plan: ProfilePlan) -> tuple[bool, str]:
        if self._profile is not None:
            return False, RUNNING
        import torch.profiler as tp

        activities = [tp.ProfilerActivity.CPU] * plan.cpu + [tp.ProfilerActivity.CUDA] * plan.gpu
        profile = tp.profile(activities=activities, with_stack=plan.with_stack, record_shapes=plan.record_shapes,
                             profile_memory=plan.memory)
        try:
            profile.start()
        except RuntimeError as exc:  # the request hears why; the decode loop goes on
            logger.warning("the profiler did not start: %s", exc)
            return False, f"the profiler did not start: {exc}"
        self._profile, self._plan, self._steps_left = profile, plan, plan.num_steps
        logger.info("profiling %s, trace to %s", f"{plan.num_steps} steps" if plan.num_steps else "until stopped",
                    plan.path)
        return True, "Start profiling."

    def _end(self) -> tuple[bool, str]:
        if self._profile is None or self._plan is None:
            return False, NOT_RUNNING
        profile, plan = self._profile, self._plan
        self._profile = self._plan = self._steps_left = None
        try:
            profile.stop()
            os.makedirs(os.path.dirname(plan.path) or ".", exist_ok=True)
            profile.export_chrome_trace(plan.path)
        except (OSError, RuntimeError) as exc:  # an unwritable directory must not fail the decode batch
            logger.warning("the profile could not be written to %s: %s", plan.path, exc)
            return False, f"the profile could not be written to {plan.path}: {exc}"
        logger.info("profile written to %s", plan.path)
        return True, f"Stop profiling. Trace: {plan.path}"


def add_profile_routes(app: FastAPI, profiler: EngineProfiler, error_response: Callable[[int, str], Any]) -> None:
    """SGLang's two profiling endpoints (GET or POST, as SGLang's); a refused request is HTTP 400."""

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(req: Annotated[ProfileRequest | None, Body()] = None):
        try:
            return Response(content=await profiler.start(req or ProfileRequest()) + "\n", status_code=200)
        except ValueError as exc:
            return error_response(400, f"start_profile: {exc}")

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile():
        try:
            return Response(content=await profiler.stop() + "\n", status_code=200)
        except ValueError as exc:
            return error_response(400, f"stop_profile: {exc}")
