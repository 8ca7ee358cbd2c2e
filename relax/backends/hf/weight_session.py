"""The hf engine's weight-update session: SGLang's `/begin_weight_update` and `/end_weight_update`,
and Relax's armed push (`/arm_weight_update`, relax/distributed/weights/armed.py).

SGLang's session: the hf engine holds weights as they load, so a session has nothing to restore or
finalize; it keeps SGLang's rules (one open at a time) so a client is held to the same sequence.
Updates outside a session are accepted (older SGLang).

Armed push (the engine announces `weight_push_armed` in /server_info): `/arm_weight_update` pauses
generation, opens the session and, once its reply is written, starts the receiver's loop
(`WeightReceiver.arm`; a loop started before held the GIL the reply needed), which takes
every bucket of the push from the group with no request per bucket. Its layout is checked before the
pause (400: one it cannot take; 409: a `layout_id` sent alone that it does not hold, which the sender
answers by sending the buckets; either way nothing was paused or broadcast). `/end_weight_update`
then waits for that loop (the sender posts it while it broadcasts: its reply is the waiter), closes
the session, resumes generation when asked (`continue_generation`) and answers the loop's outcome:
200, 400 `success: false` (a bucket refused after its bytes were received; the group is in step) or
500 (a receive or load failed; the group is quarantined, the sender rebuilds it). Two requests a push.
An arm sent `ahead` of its buckets (`weight_push_ahead`: its sender broadcasts without waiting for the
reply) starts the loop at once, and a refusal drains the buckets (`WeightReceiver.drain`) before it
answers 409 or 400 `success: false`; an arm that finds the bytes of a refused push still draining waits
for them first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from relax.backends.hf.engine import HFEngine
from relax.backends.hf.protocol import ArmWeightUpdateRequest, EndWeightUpdateRequest, UpdateWeightVersionRequest
from relax.distributed.weights.armed import ArmedPush, ahead_problem, check_sizes
from relax.distributed.weights.errors import LayoutUnknown
from relax.distributed.weights.trace import mark

logger = logging.getLogger(__name__)


def _result(success: bool, message: str) -> JSONResponse:
    """SGLang's weight-endpoint reply: 200 on success, 400 with success=false otherwise."""
    return JSONResponse({"success": success, "message": message}, status_code=200 if success else 400)


async def close_session(engine: HFEngine, *, loaded: bool = False) -> None:
    """`loaded`: an armed loop took every bucket, its last one waited for all the copies: nothing to wait for."""
    engine.weight_session_open = False
    engine.receiver.held = None  # the sender may free its flat-bucket buffer now
    if loaded:
        engine.receiver.close_session(synchronize=False)
    else:
        await asyncio.to_thread(engine.receiver.close_session)  # (waits for deferred buckets on a GPU)


async def end_armed(engine: HFEngine, armed: ArmedPush, error_response: Callable[[int, str], Any]) -> Any:
    """Wait for the armed push's loop, close its session and answer its outcome. A loop that a newer
    push has replaced (this end came late) leaves the session alone."""
    receiver = engine.receiver
    mark("engine: end received")
    armed.start()  # (the arm's reply started it, unless that reply never went out)
    try:
        outcome = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(armed.future)), receiver.timeout_s)
    except asyncio.TimeoutError:
        return error_response(500, f"the armed weight update on group {armed.plan.group_name!r} did not finish "
                                   f"within {receiver.timeout_s:.0f}s")
    if receiver.armed is not armed:
        return error_response(500, f"the armed weight update on group {armed.plan.group_name!r} was replaced by "
                                   "a newer one before its end")
    mark("engine: end sees the loop done")
    receiver.armed = None
    await close_session(engine, loaded=outcome.received)
    mark("engine: session closed")
    if not outcome.received:  # bytes may be left on the wire: nothing may receive on this group again
        if receiver.groups.get(armed.plan.group_name) is armed.group:  # (not one since made under its name)
            receiver.quarantine(armed.plan.group_name)
        return error_response(500, f"{outcome.message} (weight update group {armed.plan.group_name!r} is now out "
                                   "of step: destroy it and init a new one)")
    return _result(outcome.success, outcome.message)


async def arm(engine: HFEngine, req: ArmWeightUpdateRequest, error_response: Callable[[int, str], Any]) -> Any:
    """`/arm_weight_update`: check the layout (before the pause: a request that cannot work aborts nothing),
    pause, arm the receiver's loop and answer; the loop starts once the reply is written (the sender
    broadcasts nothing before it reads it), or at once for an arm sent `ahead` of the buckets, whose
    refusal drains them (`_refuse`)."""
    receiver = engine.receiver
    mark("engine: arm received")
    drain = receiver.draining
    if drain is not None and not drain.done():  # the bytes of a push refused just before are still coming
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(drain.future)), receiver.timeout_s)
        except asyncio.TimeoutError:
            return error_response(500, f"arm_weight_update: draining a refused push from group {drain.group_name!r} "
                                       f"did not end within {receiver.timeout_s:.0f}s")
    payload = req.model_dump()
    try:
        receiver.group(req.group_name)
        problem = ahead_problem(payload)
        if problem is not None:
            raise ValueError(problem)
    except ValueError as exc:  # nothing to drain by, or no group to drain from: the sender rebuilds the group
        return error_response(400, f"arm_weight_update: {exc}")
    try:
        plan = receiver.plan(payload)
        if req.ahead:
            check_sizes(plan, req.bytes, receiver.layouts)
    except LayoutUnknown as exc:  # the sender arms again with the buckets
        return _refuse(engine, req, 409, f"arm_weight_update: {exc}", error_response)
    except ValueError as exc:
        return _refuse(engine, req, 400, f"arm_weight_update: {exc}", error_response)
    await engine.scheduler.pause(req.pause_mode)
    mark("engine: paused")
    if engine.weight_session_open and (receiver.armed is None or receiver.armed.done()):
        logger.warning("a weight-update session was left open (a push that did not finish); closing it")
        receiver.armed = None
        await close_session(engine)
    try:
        armed = receiver.arm(plan, start=req.ahead)
    except ValueError as exc:  # refused before anything was broadcast: the pause was this request's
        engine.scheduler.resume()
        return error_response(400, f"arm_weight_update: {exc}")
    engine.weight_session_open = True
    mark("engine: armed (replying)")
    reply = _result(True, f"armed for {len(armed.plan.buckets)} buckets on group {armed.plan.group_name!r}")
    reply.background = BackgroundTask(_start, armed)
    return reply


def _refuse(engine: HFEngine, req: ArmWeightUpdateRequest, status: int, message: str,
            error_response: Callable[[int, str], Any]) -> Any:
    """An arm refused before the pause: `status` 409 (a layout id the engine does not hold) or 400. One sent
    `ahead` of its buckets first has them drained (`WeightReceiver.drain`) and answers 409 or a `success:
    false` 400, which tell the sender its broadcasts are taken; a drain that cannot start answers 500."""
    if not req.ahead:
        return error_response(status, message)
    try:
        engine.receiver.drain(req.group_name, req.bytes, message)
    except ValueError as exc:
        return error_response(500, f"{message}; its buckets cannot be drained: {exc}")
    if status == 409:
        return error_response(409, f"{message} (this push's buckets are drained)")
    return _result(False, f"{message} (this push's buckets are drained, nothing loaded)")


async def _start(armed: ArmedPush) -> None:
    armed.start()  # (a coroutine: Starlette runs a plain function's background task in its thread pool)


def add_weight_session_routes(app: FastAPI, engine: HFEngine, error_response: Callable[[int, str], Any]) -> None:
    """/begin_weight_update, /arm_weight_update, /end_weight_update, /update_weight_version."""
    receiver = engine.receiver

    @app.post("/begin_weight_update")
    async def begin_weight_update():
        if engine.weight_session_open:
            return _result(False, "a weight-update session is already open; call end_weight_update() first")
        engine.weight_session_open = True
        engine.next_bucket = 0  # a pipelined push numbers its buckets from 0
        receiver.open_session()
        return _result(True, "Success")

    @app.post("/arm_weight_update")
    async def arm_weight_update(req: ArmWeightUpdateRequest):
        return await arm(engine, req, error_response)

    @app.post("/end_weight_update")
    async def end_weight_update(req: EndWeightUpdateRequest | None = None):
        armed = receiver.armed
        try:
            if armed is not None:
                return await end_armed(engine, armed, error_response)
            if not engine.weight_session_open:
                return _result(False, "no weight-update session is open; call begin_weight_update() first")
            await close_session(engine)
            return _result(True, "Success")
        finally:
            if req is not None and req.continue_generation and receiver.armed is None:
                engine.scheduler.resume()

    @app.post("/update_weight_version")
    async def update_weight_version(req: UpdateWeightVersionRequest):
        if req.abort_all_requests:
            engine.scheduler.abort(abort_all=True, message="aborted by update_weight_version")
        engine.weight_version = req.new_version
        return {"success": True, "message": f"Weight version updated to {req.new_version}",
                "new_version": req.new_version}
