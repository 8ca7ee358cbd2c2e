"""Where the weight sender's requests go: one receiver interface, one class per transport.

`WeightSender` speaks the protocol of `protocol.py` to a list of receivers, each an `Endpoint`:
`async post(path, payload, timeout_s)` returning the reply or raising the protocol's errors
(`BucketRejected`: received, refused, the group stays in step; `EndpointMissing`: an engine
without that endpoint; `LayoutUnknown`: an arm naming a layout the engine does not hold, sent again
in full; `WeightSyncError`: anything else, the group is rebuilt).
- `HTTPEndpoint`: an inference engine's HTTP API (SGLang or the hf engine) through the one engine
  client, `relax.distributed.engine_client.EngineClient` (its timeouts, and its retries of the
  idempotent control calls only: `http_utils.IDEMPOTENT_PATHS`, never a weight-group call).
- `RayEndpoint`: a training-backend rank behind a Ray handle (fully-async ActorFwd ranks join the
  same broadcast group as the engines); its `receive_weights(path, payload)` answers as an engine.
Any other object with the same `post` may be passed to the sender as a receiver.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from relax.distributed.engine_client import EngineClient, EngineError
from relax.distributed.weights.errors import BucketRejected, EndpointMissing, LayoutUnknown, WeightSyncError


class Endpoint(Protocol):
    async def post(self, path: str, payload: dict, timeout_s: float) -> Any: ...


# Relax's extensions of the protocol a receiver may take (protocol.py), as /server_info names them:
IN_ORDER = "weight_buckets_in_order"  # several buckets posted at once (`bucket_index`), loaded in order
FLAT = "weight_buckets_flat"  # a bucket broadcast as one flat buffer (`load_format: flat_bytes`)
ARMED = "weight_push_armed"  # a whole push armed in one request, no request per bucket (armed.py)
AHEAD = "weight_push_ahead"  # and its buckets broadcast before the arm is answered: a refusal drains them
FEATURES = (IN_ORDER, FLAT)  # what a training rank takes (it does not arm: armed.py says why)
EXTENSIONS = (IN_ORDER, FLAT, ARMED, AHEAD)  # every extension of the push a sender may use
# An engine that answers /weights_checker per HF name (the hf engine; --check-weight-update-equal, check.py)
CHECKSUMS = "weights_checker_by_name"


async def receiver_features(receiver: Any) -> frozenset[str]:
    """The extensions `receiver` takes: the hf engine lists them in /server_info, a training rank
    takes `FEATURES` (Ray runs one caller's calls to an actor in order; it receives as the engine
    does), SGLang and unknown receivers none (one bucket at a time, one broadcast per tensor)."""
    probe = getattr(receiver, "features", None)
    return frozenset(await probe()) if probe is not None else frozenset()


def weight_sync_error(err: EngineError) -> WeightSyncError:
    """An engine client's failure as the sender's error: 404 -> EndpointMissing, 409 -> LayoutUnknown
    (an arm by layout id alone that the engine cannot take), a reply with `success: false` ->
    BucketRejected, anything else (no reply, other status) -> WeightSyncError. The message is the
    client's: the URL with the path, the status and the engine's words."""
    if err.status == 404:
        return EndpointMissing(str(err))
    if err.status == 409:
        return LayoutUnknown(str(err))
    if isinstance(err.body, dict) and err.body.get("success") is False:
        return BucketRejected(str(err))
    return WeightSyncError(str(err))


class HTTPEndpoint:
    """An engine's HTTP API as a receiver. The client is opened on the first call and again after
    `close()` (a sender reconnects after a failed push)."""

    def __init__(self, url: str, *, api_key: str | None = None, transport: Any = None) -> None:
        self.url = url.rstrip("/")
        self._api_key, self._transport = api_key, transport
        self._client: EngineClient | None = None

    def __repr__(self) -> str:
        return self.url

    async def post(self, path: str, payload: dict, timeout_s: float) -> Any:
        if self._client is None:
            self._client = EngineClient(self.url, self._api_key, transport=self._transport)
        try:
            return await self._client.post(path, payload, timeout=max(timeout_s, 0.001))
        except EngineError as err:
            raise weight_sync_error(err) from err

    async def features(self) -> frozenset[str]:
        if self._client is None:
            self._client = EngineClient(self.url, self._api_key, transport=self._transport)
        try:
            info = await self._client.get_server_info()
        except EngineError:
            return frozenset()
        return frozenset(f for f in (*EXTENSIONS, CHECKSUMS) if info.get(f))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


class RayEndpoint:
    """A training-backend rank behind a Ray actor handle. Its reply says whether the bucket's bytes
    were consumed (`received`): a refusal after receiving is BucketRejected, before it
    WeightSyncError; a rank that died or raised, or no reply by the deadline, too.

    The handle travels pickled and is unpickled where it is first used (the sender): Ray imports
    an actor's class to unpickle its handle, and the DCS coordinator, which only stores and
    returns endpoints, would import the training backend (torch, ~2 s of CPU) for nothing.
    The rank's owner (the role that created it) keeps it alive, not these copies."""

    def __init__(self, handle: Any, name: str) -> None:
        self._handle, self._pickled, self.name = handle, None, name

    @property
    def handle(self) -> Any:
        if self._handle is None:
            from ray import cloudpickle

            self._handle = cloudpickle.loads(self._pickled)
        return self._handle

    def __getstate__(self) -> dict[str, Any]:
        if self._pickled is None:
            from ray import cloudpickle

            self._pickled = cloudpickle.dumps(self._handle)
        return {"name": self.name, "pickled": self._pickled}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._handle, self._pickled, self.name = None, state["pickled"], state["name"]

    def __repr__(self) -> str:
        return f"RayEndpoint({self.name})"

    async def features(self) -> frozenset[str]:
        return frozenset(FEATURES)  # Ray runs one caller's calls to an actor in submission order

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
