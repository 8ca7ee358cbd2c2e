"""Engine side of SGLang's distributed weight update for the `hf` engine.

`/init_weights_update_group` joins a broadcast group (rank = rank_offset; this engine is one
process on one device) built by `relax.distributed.weight_sync.create_weight_group`.
`/update_weights_from_distributed` lists tensors {names, dtypes, shapes}; the engine receives
each one, in order, from rank 0 into a scratch tensor, then checks the names and shapes
against the model (HF parameter names, tied aliases included) and copies them in under the
model's step lock, so no forward sees half a bucket.

The receive always happens for a well-formed request, even when a name or shape is wrong:
the sender is blocked in the broadcast and must not hang. The bucket is then rejected as a
whole (nothing loaded) with a message naming every bad tensor. A malformed request (unknown
dtype, lists of different lengths, unknown group) is rejected before any receive.
"""

from __future__ import annotations

import logging

from relax.distributed.weight_sync import (  # noqa: F401 - re-exported: the engine's receiver and parsing
    DTYPES, MAX_TENSORS_PER_REQUEST, TensorSpec, WeightReceiver, parse_dtype, parse_specs)

logger = logging.getLogger(__name__)
