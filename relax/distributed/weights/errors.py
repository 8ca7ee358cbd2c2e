"""The weight push's errors, the whole contract between the sender and its receivers' transports
(protocol.py says when each is raised). Apart from protocol.py, which needs torch, so that a process that
only holds receivers (the DCS coordinator unpickling `endpoints.RayEndpoint`s) does not load torch.
"""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """A weight push failed; the message names the engine and what it said."""


class BucketRejected(WeightSyncError):
    """An engine replied `success: false`: it received the whole bucket, then refused to load it.

    SGLang and the hf engine only answer this way after the broadcast, so the group is still in
    step. Any other failure (4xx/5xx without `success`, timeout, lost connection) may leave
    bytes on the wire, and the group must be rebuilt.
    """


class EndpointMissing(WeightSyncError):
    """The engine answered 404: it does not serve this endpoint (an older SGLang)."""


class LayoutUnknown(WeightSyncError):
    """A receiver refused an `/arm_weight_update` that named its layout by `layout_id` alone: it does not
    hold that layout (restarted, or it kept newer ones; armed.py). Raised by the receiver, HTTP 409 on the
    wire; nothing was paused or armed, and the sender sends the layout in full once more."""
