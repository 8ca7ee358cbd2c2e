"""Trainer -> inference-engine weight push: SGLang's protocol, its wire types, limits and errors.

Protocol (the one SGLang serves and slime drives; `sender.WeightSender` drives it,
`receiver.WeightReceiver` and the hf engine's routes answer it):
1. `connect()`: the trainer picks a free port and POSTs `/init_weights_update_group`
   {master_address, master_port, rank_offset=1+i, world_size=1+n, group_name, backend} to every
   engine while joining the same group as rank 0 itself. The group listens on loopback unless an
   engine is on another host (an external engine): then on this host's address towards it.
2. `push(named_tensors, version=v)`: `/pause_generation` on every engine,
   `/begin_weight_update` (SGLang >= 0.5.23 loads weights only inside such a session; an
   engine that answers 404 predates sessions and is pushed to without one), then per bucket of
   at most `bucket_bytes` a POST `/update_weights_from_distributed`
   {names, dtypes, shapes, group_name, flush_cache, weight_version} to every engine while rank 0
   broadcasts each tensor of the bucket, in order; then `/end_weight_update` (SGLang finalizes
   the loaded weights there) and `/continue_generation`.
   `weight_version` rides on the last bucket only, so an engine reports the new version only
   once it holds all of it; `flush_cache` is true on the last bucket only (the cache is flushed
   once, when the new weights are in: no `/flush_cache` round trip). A receiver on the sender's
   own GPU takes the same buckets through `/update_weights_from_tensor` as CUDA IPC handles
   instead (`ipc.py`). Relax's extension: receivers that say they load buckets in order (the hf
   engine's /server_info `weight_buckets_in_order`; training ranks behind Ray) get several
   buckets in flight at once, each request carrying its `bucket_index` (`sender.py`); receivers
   that say they take flat buckets (`weight_buckets_flat`) get each bucket as ONE broadcast of its
   bytes (`load_format: "flat_bytes"`, laid out by `flat_layout`) instead of one per tensor (an NCCL
   broadcast costs ~0.1-0.2 ms of launch and sync whatever its size: 310 tensors of a 0.6B model
   took 59 ms one by one and 3.4 ms as one buffer on 2x H200); and their pause and session calls
   go out together (`/pause_generation` with `/begin_weight_update`, `/end_weight_update` with
   `/continue_generation`): one round trip each side of the buckets instead of two.
   Armed receivers (`weight_push_armed`: the hf engine; `armed.py`) take a push in two requests
   whatever its bucket count: `/arm_weight_update` {group_name, layout_id, buckets: [{names, dtypes,
   shapes, bytes}], load_format, weight_version, flush_cache, pause_mode} (`buckets` left out once the
   receiver holds `layout_id`; 409 `LayoutUnknown` when it does not) pauses, opens the session and arms
   a receive loop in a thread of the receiver's own that takes every bucket from the group in order
   and holds the version until the last is in; the sender broadcasts the buckets back to back with no
   request per bucket and `/end_weight_update` {continue_generation: true}, posted as soon as the arm
   is answered, replies once the loop is done (400 `success: false`: a bucket refused, all bytes
   taken; 500: a receive or load failed, the group is rebuilt) and resumes generation. Receivers of
   one push may mix: armed or not, the broadcasts are the same. Receivers that take
   `weight_push_ahead` and hold the layout are armed `ahead` of the buckets, which go out at once
   (a refusal drains them: armed.py).
3. `close()`: `/destroy_weights_update_group` and the local group is dropped.

Failure handling: an engine that rejects a bucket after receiving it answers `success: false`
(`BucketRejected`: the group is still in step); a 404 is `EndpointMissing` (an older SGLang);
anything else, or a missed deadline, is `WeightSyncError` and the group is rebuilt. These
errors are the whole contract between the sender and its receivers' transports
(`endpoints.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from relax.distributed.weights.errors import (  # noqa: F401 (re-exported)
    BucketRejected, EndpointMissing, LayoutUnknown, WeightSyncError,
)

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024  # --update-weight-buffer-size default
MAX_TENSORS_PER_REQUEST = 100_000  # a receiver refuses a bucket listing more
FLAT_BYTES = "flat_bytes"  # `load_format` of a bucket broadcast as one buffer (Relax's extension)
FLAT_ALIGN = 256  # every tensor of a flat bucket starts at a multiple of this many bytes

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SyncStats:
    """One push: bytes sent, wall seconds, gbps = gigabytes (1e9 B) per second, buckets, version."""

    bytes: int
    seconds: float
    gbps: float
    num_buckets: int
    version: int


def parse_dtype(name: str) -> torch.dtype:
    key = name.removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's wire name for a dtype: 'bfloat16', 'float32', ..."""
    return str(dtype).replace("torch.", "")


def parse_specs(names: list[str], dtypes: list[str], shapes: list[list[int]]) -> list[TensorSpec]:
    """Validate the request lists (same length, known dtypes, non-negative dims)."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(f"names, dtypes and shapes must have the same length, "
                         f"got {len(names)}, {len(dtypes)}, {len(shapes)}")
    if not names:
        raise ValueError("names is empty: nothing to update")
    if len(names) > MAX_TENSORS_PER_REQUEST:
        raise ValueError(f"at most {MAX_TENSORS_PER_REQUEST} tensors per request, got {len(names)}")
    specs = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor {name!r}: negative dimension in shape {shape}")
        specs.append(TensorSpec(name, parse_dtype(dtype), tuple(shape)))
    return specs


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def spec_bytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * spec.dtype.itemsize


def flat_layout(sizes: Sequence[int], align: int = FLAT_ALIGN) -> tuple[list[int], int]:
    """Where each of a flat bucket's tensors (`sizes` in bytes, in order) starts, and the buffer's
    length: back to back, each start rounded up to `align` bytes (so every dtype's view of it is
    aligned). Sender and receiver both lay a bucket out with this one function."""
    offsets, end = [], 0
    for size in sizes:
        start = -(-end // align) * align
        offsets.append(start)
        end = start + size
    return offsets, end


def unpadded(sizes: Sequence[int]) -> bool:
    """A flat layout with no padding: every tensor but the last ends on the alignment."""
    return all(size % FLAT_ALIGN == 0 for size in sizes[:-1])


def flat_views(flat: torch.Tensor, specs: Sequence[TensorSpec]) -> list[torch.Tensor]:
    """The tensors of a flat bucket (uint8 `flat`), as views into it, by the specs' layout."""
    sizes = [spec_bytes(s) for s in specs]
    offsets, _ = flat_layout(sizes)
    return [flat[o:o + n].view(s.dtype).view(s.shape) for o, n, s in zip(offsets, sizes, specs)]


def cut_flat(flat: torch.Tensor, dtype: torch.dtype, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`flat_views` of a bucket of one `dtype` with no padding (`unpadded`), given tensors of its shapes in
    order (`like`, e.g. the parameters it loads into): one C++ call (`unflatten_dense_tensors`) instead of
    two views a tensor in Python, which an engine's receive loop runs while its HTTP thread waits for the GIL."""
    return list(torch._C._nn.unflatten_dense_tensors(flat.view(dtype), list(like)))


def pack_flat(tensors: Sequence[torch.Tensor], device: Any) -> torch.Tensor:
    """A flat bucket: `tensors` copied (and moved to `device`) into one uint8 buffer laid out by
    `flat_layout`; `flat_views` reads it back."""
    sizes = [tensor_bytes(t) for t in tensors]
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    back_to_back = unpadded(sizes) and all(t.device == device for t in tensors)
    if back_to_back and len(tensors) > 1 and len({t.dtype for t in tensors}) == 1:
        # one copy kernel from one C++ call: no reshape and view a tensor in Python, which the sender's
        # pack thread would run holding the GIL its event loop needs (for one tensor it returns a view)
        return torch._C._nn.flatten_dense_tensors(list(tensors)).view(torch.uint8)
    offsets, total = flat_layout(sizes)
    flat = torch.empty(total, dtype=torch.uint8, device=device)
    if back_to_back:  # (weight matrices, most vectors): one copy kernel, not one per tensor
        torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors], out=flat)
        return flat
    for tensor, offset, size in zip(tensors, offsets, sizes):
        flat[offset:offset + size].view(tensor.dtype).view(tensor.shape).copy_(tensor)
    return flat


def iter_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                 ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors in order into buckets of at most `bucket_bytes` (a larger tensor goes alone)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def with_last(items: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """Yield (item, is_last) with one item of lookahead."""
    previous = next(items, None)
    while previous is not None:
        current = next(items, None)
        yield previous, current is None
        previous = current
