"""Receiver endpoints that are not HTTP engines: training-backend ranks behind Ray handles.

`RayEndpoint.post(path, payload, timeout_s)` has the shape `WeightSender` expects of an engine
URL, so ActorFwd ranks join the same broadcast group as the engines. Errors map onto the
sender's: a refused bucket whose bytes were received is `BucketRejected` (the group stays in
step), anything else `WeightSyncError` (the group is rebuilt), a missing reply by the deadline
too.
"""

from __future__ import annotations

import asyncio
from typing import Any

from relax.distributed.weight_sync import BucketRejected, WeightSyncError


class RayEndpoint:
    def __init__(self, handle: Any, name: str) -> None:
        self.handle, self.name = handle, name

    def __repr__(self) -> str:
        return f"RayEndpoint({self.name})"

    async def post(self, path: str, payload: dict, timeout_s: float) -> dict:
        ref = self.handle.receive_weights.remote(path, payload)
        try:
            body = await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout=max(timeout_s, 0.001))
        except asyncio.TimeoutError as exc:
            raise WeightSyncError(f"{self.name}{path}: no reply within {timeout_s:.0f}s") from exc
        except Exception as exc:  # noqa: BLE001 - the rank died or raised: name it
            raise WeightSyncError(f"{self.name}{path}: {type(exc).__name__}: {exc}") from exc
        if not body.get("success"):
            error = BucketRejected if body.get("received") else WeightSyncError
            raise error(f"{self.name}{path}: {body.get('message')}")
        return body
