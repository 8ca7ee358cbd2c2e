"""CUDA IPC handles for a weight push between two processes on one GPU.

NCCL refuses a group with two ranks on the same GPU, so a trainer rank and an engine that
share a GPU (colocate, or fully async on fewer GPUs than roles) cannot broadcast to each
other. SGLang's answer is `/update_weights_from_tensor`: the sender pickles its tensors with
torch's multiprocessing reductions (a CUDA tensor becomes an IPC handle to its memory, not
its bytes), base64-encodes the result per tensor-parallel rank, and the receiver opens the
handles and copies from the sender's memory. This module is both sides of that encoding,
byte-compatible with SGLang's `MultiprocessingSerializer` as its tensor-parallel workers read it.

A handle names its GPU. torch writes the sender's device *index*, which means another GPU in a
process with another CUDA_VISIBLE_DEVICES (an engine over GPUs 2,3 and a trainer that sees only
GPU 3 as cuda:0). As SGLang's patched reductions do, the index is replaced by the GPU's UUID when
writing and mapped back to the receiver's own index when reading (`_rebuild_cuda_tensor`).
Each payload is written once per receiving process: torch counts the readers of a CUDA IPC
block by the handles it wrote, so one payload read by two tensor-parallel ranks would free
the block under one of them.

A bucket travels as SGLang's flattened bucket (`load_format="flattened_bucket"`): its tensors
back to back in one tensor, so one IPC handle per bucket instead of one per tensor (each handle
is shared, pickled, opened and released on its own: on an H100 a Qwen3-4B push of 398 tensors in
2 GiB buckets took 0.13 s through per-tensor handles, 0.06 s as flat buckets), and per tensor
its name, shape, dtype and [start_idx, end_idx) in the flat tensor, as attribute objects (SGLang
reads them by attribute). `flatten_bucket` writes it, `unflatten_bucket` checks and reads it. A
bucket whose tensors have several dtypes cannot be one flat tensor: it travels as the list of
(name, tensor) pairs (`load_format` none), one handle per tensor.

Both sides of a payload are here, so that what the sender writes and what every receiver reads
cannot drift apart: `encode_bucket` + `tensor_payload` build the `/update_weights_from_tensor`
body (the sender), `decode_tensor_payload` reads it back whatever its `load_format`
(`WeightReceiver.load_tensor_payload`, which the hf engine and the training ranks call). The
(de)serializer is a parameter of both, so that tests run the same code on CPU tensors.

Unpickling runs code named by the payload, so the receiving side admits only the callables
that rebuild a CUDA tensor (`SafeUnpickler`); anything else — `os.system`, a CPU file
descriptor, a custom class — is refused with the name it asked for. The endpoints that take
these payloads are behind the run's API token as well.
"""

from __future__ import annotations

import base64
import copyreg
import io
import math
import os
import pickle
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import torch

# (module, name) pairs a weight payload may name: the CUDA tensor rebuild, the classes and
# dtypes its arguments carry, and the containers of the (name, tensor) list.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),
    ("torch._tensor", "Tensor"), ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"),
    ("torch.storage", "TypedStorage"), ("torch.storage", "UntypedStorage"), ("torch", "Size"),
    ("builtins", "tuple"), ("builtins", "list"), ("builtins", "dict"), ("collections", "OrderedDict"),
    ("types", "SimpleNamespace"),  # a flattened bucket's per-tensor metadata (attributes only)
} | {("torch", name) for name in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16",
                                  "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2")})


DEVICE_ARG = 6  # position of the device in torch's `rebuild_cuda_tensor` arguments (stable since torch 1.x)


class UnsafePayload(ValueError):
    """A weight payload named something other than a CUDA tensor rebuild."""


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def local_device(device: int | str) -> int:
    """A handle's device as this process numbers it: an index is kept, a UUID is looked up."""
    if isinstance(device, int):
        return device
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == device:
            return index
    raise ValueError(f"weight payload names GPU {device}, which this process does not see "
                     f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")


def _rebuild_cuda_tensor(*args: Any) -> torch.Tensor:
    from torch.multiprocessing import reductions

    args = (*args[:DEVICE_ARG], local_device(args[DEVICE_ARG]), *args[DEVICE_ARG + 1:])
    return reductions.rebuild_cuda_tensor(*args)


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise UnsafePayload(f"weight payload refused: it names {module}.{name}, which is not a CUDA tensor "
                                "rebuild (only CUDA IPC handles of tensors are accepted)")
        if (module, name) == ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"):
            return _rebuild_cuda_tensor  # the same rebuild, reading a UUID as well as an index
        return super().find_class(module, name)


def _reduce_with_uuid(tensor: torch.Tensor) -> tuple[Callable, tuple]:
    """torch's reduction of a tensor, with a CUDA tensor's device index written as its UUID."""
    from torch.multiprocessing import reductions

    rebuild, args = reductions.reduce_tensor(tensor)
    if rebuild is reductions.rebuild_cuda_tensor:
        args = (*args[:DEVICE_ARG], device_uuid(args[DEVICE_ARG]), *args[DEVICE_ARG + 1:])
    return rebuild, args


def serialize(obj: Any) -> str:
    """`obj` (e.g. a list of (name, CUDA tensor)) as SGLang's `MultiprocessingSerializer` writes
    it with `output_str=True`: ForkingPickler bytes, base64, a CUDA tensor's device as its UUID.
    CUDA tensors travel as IPC handles; the caller keeps them alive until the receiver has
    answered. Call once per receiving process (module docstring)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers the tensor reductions with ForkingPickler

    buffer = io.BytesIO()
    pickler = ForkingPickler(buffer)
    pickler.dispatch_table = {**copyreg.dispatch_table, **ForkingPickler._extra_reducers,
                              torch.Tensor: _reduce_with_uuid, torch.nn.Parameter: _reduce_with_uuid}
    pickler.dump(obj)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def deserialize(text: str | bytes) -> Any:
    """The receiving side: base64, then `SafeUnpickler`. Raises `UnsafePayload` or ValueError."""
    import torch.multiprocessing  # noqa: F401 - the rebuild functions

    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"weight payload is not base64: {exc}") from exc
    return SafeUnpickler(io.BytesIO(data)).load()


def named_tensors(payload: Any) -> list[tuple[str, torch.Tensor]]:
    """Check the shape of a deserialized `/update_weights_from_tensor` entry: (name, tensor) pairs."""
    if isinstance(payload, dict):
        payload = list(payload.items())
    if not isinstance(payload, (list, tuple)) or not all(
            isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
            and isinstance(item[1], torch.Tensor) for item in payload):
        raise ValueError("serialized_named_tensors must hold a list of (name, tensor) pairs")
    return [(name, tensor) for name, tensor in payload]


FLATTENED_BUCKET = "flattened_bucket"  # SGLang's load_format for a bucket sent as one flat tensor
_META_FIELDS = ("name", "shape", "dtype", "start_idx", "end_idx", "numel")


def flatten_bucket(named: list[tuple[str, torch.Tensor]], out: torch.Tensor | None = None) -> dict[str, Any] | None:
    """SGLang's flattened bucket of `named`: {"flattened_tensor": the tensors back to back,
    "metadata": per tensor its name, shape, dtype and span}. None when their dtypes differ (one
    flat tensor holds one dtype; the caller sends the tensors one by one then). `out`: a byte
    buffer (uint8, at least the bucket's bytes) to write the flat tensor into, so that every
    bucket of a push shares one CUDA allocation and a receiver that keeps it open across buckets
    opens one handle per push (torch's IPC cache is keyed by allocation)."""
    if not named or len({t.dtype for _, t in named}) != 1:
        return None
    parts = [t.detach().reshape(-1) for _, t in named]
    if out is None:
        flat = torch.cat(parts)
    else:
        dtype, numel = parts[0].dtype, sum(p.numel() for p in parts)
        flat = torch.cat(parts, out=out[:numel * dtype.itemsize].view(dtype))
    metadata, start = [], 0
    for name, t in named:
        metadata.append(SimpleNamespace(name=name, shape=t.shape, dtype=t.dtype, start_idx=start,
                                        end_idx=start + t.numel(), numel=t.numel()))
        start += t.numel()
    return {"flattened_tensor": flat, "metadata": metadata}


def unflatten_bucket(payload: Any) -> list[tuple[str, torch.Tensor]]:
    """A deserialized flattened bucket -> (name, view into the flat tensor) pairs, each span
    checked against the flat tensor (ValueError naming the first bad entry)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("flattened_tensor"), torch.Tensor) \
            or not isinstance(payload.get("metadata"), (list, tuple)):
        raise ValueError('a flattened bucket must be {"flattened_tensor": tensor, "metadata": [...]}')
    flat = payload["flattened_tensor"]
    if flat.dim() != 1:
        raise ValueError(f"flattened_tensor must be 1-D, got shape {tuple(flat.shape)}")
    named = []
    for i, meta in enumerate(payload["metadata"]):
        get = meta.get if isinstance(meta, dict) else lambda key, m=meta: getattr(m, key, None)
        name, shape, dtype, start, end, numel = (get(key) for key in _META_FIELDS)
        ok = (isinstance(name, str) and isinstance(shape, (tuple, list)) and all(isinstance(d, int) for d in shape)
              and dtype == flat.dtype and all(isinstance(v, int) for v in (start, end, numel))
              and 0 <= start <= end <= flat.numel() and end - start == numel == math.prod(shape))
        if not ok:
            raise ValueError(f"flattened bucket metadata entry {i} ({name!r}) does not fit the flat tensor of "
                             f"{flat.numel()} {flat.dtype} elements: shape {shape}, dtype {dtype}, span "
                             f"[{start}, {end}), numel {numel}")
        named.append((name, flat[start:end].view(tuple(shape))))
    return named


# ---- the /update_weights_from_tensor body: written by the sender, read by every receiver ---------
LOAD_FORMATS = (None, FLATTENED_BUCKET)  # what `encode_bucket` writes and `decode_tensor_payload` reads
NamedTensors = list[tuple[str, torch.Tensor]]


def encode_bucket(named: Sequence[tuple[str, torch.Tensor]], out: torch.Tensor | None = None
                  ) -> tuple[Any, str | None]:
    """What a bucket travels as, and its `load_format`: SGLang's flattened bucket when its tensors
    share one dtype (one IPC handle per bucket; `out` as in `flatten_bucket`), else the (name,
    tensor) list (load_format None: one handle per tensor)."""
    flat = flatten_bucket(list(named), out=out)
    return (flat, FLATTENED_BUCKET) if flat is not None else (list(named), None)


def tensor_payload(bucket: Any, load_format: str | None, *, copies: int, weight_version: str | None,
                   serializer: Callable[[Any], Any] = serialize, flush_cache: bool = False) -> dict[str, Any]:
    """The `/update_weights_from_tensor` body of an `encode_bucket` result: one serialized copy per
    tensor-parallel rank of the receiver, each written anew (a payload read by two processes
    would free the block under one of them)."""
    return {"serialized_named_tensors": [serializer(bucket) for _ in range(copies)], "load_format": load_format,
            "flush_cache": flush_cache, "weight_version": weight_version}


def decode_tensor_payload(payload: dict[str, Any], deserializer: Callable[[Any], Any] = deserialize
                          ) -> tuple[NamedTensors, torch.Tensor | None]:
    """An `/update_weights_from_tensor` body -> tensor-parallel rank 0's (name, tensor) pairs, and
    for a flattened bucket the flat tensor they are views into (None for a list). ValueError for
    an unknown `load_format`, a malformed body or an unsafe payload."""
    load_format = payload.get("load_format")
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format={load_format!r} is not supported by update_weights_from_tensor "
                         f"(use none or {FLATTENED_BUCKET!r})")
    serialized = payload.get("serialized_named_tensors")
    if not isinstance(serialized, (list, tuple)) or not serialized:
        raise ValueError("serialized_named_tensors must be a non-empty list (one entry per tensor-parallel rank)")
    try:
        bucket = deserializer(serialized[0])
    except (RuntimeError, EOFError, pickle.UnpicklingError) as exc:  # a handle that does not open, cut bytes
        raise ValueError(f"weight payload does not unpickle: {type(exc).__name__}: {exc}") from exc
    if load_format == FLATTENED_BUCKET:
        return unflatten_bucket(bucket), bucket["flattened_tensor"]
    return named_tensors(bucket), None
