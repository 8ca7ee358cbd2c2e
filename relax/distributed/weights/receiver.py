"""Receiving side of the weight push: load HF-named tensors, received or handed over, into a model.

`WeightReceiver` answers the protocol of `protocol.py` for the `hf` engine (its HTTP routes in
`relax.backends.hf.server`) and, subclassed for their shards, for the training ranks that take
weights in fully-async mode (`relax.backends.fsdp.weights`, `relax.backends.megatron.weights`,
reached through `endpoints.RayEndpoint`). It holds the weight groups it joined and has one
entry point per way a bucket arrives:
- `receive_and_load(specs, group_name, flat)` / `update(payload)`: `/update_weights_from_distributed`,
  the tensors broadcast by rank 0 of the group, one by one or (`load_format: "flat_bytes"`, Relax's
  extension) as one buffer of the bucket's bytes;
- `load_tensor_payload(payload)`: `/update_weights_from_tensor`, CUDA IPC handles from a sender on
  the same GPU, in either `load_format` the sender writes (`ipc.decode_tensor_payload`);
- `arm(payload)`: `/arm_weight_update` (Relax's armed push, `armed.py`): the whole push's layout at
  once, its buckets then taken from the group by a loop in a thread of its own (`armed`).
Every one checks names and shapes first (a bucket that does not fit is rejected whole, nothing
loaded) and takes the push's `weight_version` when the bucket carries it (the last one).

The names are HF checkpoint names; `hf_targets` maps them onto a transformers model, fused MoE
experts included (`expert_views`), and `load_hf_named` writes a whole HF state that way.

Two costs are kept off a push's path. The model walk (`hf_targets`: ~2 ms on a 0.6B model, holding
the GIL) is made once per session, and with `cache_walk` (the hf engine's) once for as long as the
model's tensors stay where they are: its owner calls `forget_walk` whenever they may be replaced
(memory released or resumed: `model.to()` makes new buffers and leaves fused experts' views on the
old storage). A bucket's tensors are copied in by `copy_all`, one `torch._foreach_copy_` per
(device, dtype) group instead of one `copy_` per tensor (~100 kernel launches a 512 MiB bucket).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from relax.distributed.weights.armed import ArmedDrain, ArmedPlan, ArmedPush, Layouts, parse_plan
from relax.distributed.weights.group import WeightGroup, create_weight_group
from relax.distributed.weights.ipc import decode_tensor_payload, deserialize
from relax.distributed.weights.protocol import (
    FLAT_BYTES, TensorSpec, cut_flat, flat_layout, flat_views, parse_specs, spec_bytes, unpadded,
)

FLAT_PLANS_KEPT = 256  # flat buckets whose `FlatBucketPlan` a receiver keeps (a push of a 4B model at 64 MiB: 120)


@dataclass(frozen=True)
class FlatBucketPlan:
    """What loading a flat bucket takes besides its bytes, worked out once for its specs (an armed push's
    buckets are the same parsed lists every push, `armed.Layouts`) and the model walk they were checked
    against: a receive loop then spends a few torch calls a bucket, not a few hundred lines of Python
    holding the GIL its engine's HTTP thread needs (2x H200 trace: 1-2 ms a bucket)."""

    specs: list[TensorSpec]
    walk: dict[str, torch.Tensor]
    nbytes: int  # the flat buffer's length
    problems: list[str]  # why the bucket is refused (its bytes are taken, nothing loaded)
    targets: list[torch.Tensor] | None  # per spec, the model tensor it loads into (None: a subclass's `load`)
    cut: bool  # one dtype, no padding: its views in one call (`protocol.cut_flat`)
    one_copy: bool  # and one `_foreach_copy_` into distinct targets of one dtype and device


def expert_views(targets: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names of fused MoE expert weights, as views into them. transformers >= 5 holds
    a layer's experts as `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first) and
    `mlp.experts.down_proj` [E, H, I]; checkpoints, SGLang and the megatron backend's push name
    them per expert (`mlp.experts.{e}.gate_proj.weight`, ...). Writing a view writes the weight."""
    views: dict[str, torch.Tensor] = {}
    for name, t in targets.items():
        prefix, _, leaf = name.rpartition(".")
        if not prefix.endswith("mlp.experts") or t.dim() != 3:
            continue
        for e in range(t.shape[0]):
            if leaf == "gate_up_proj":
                gate, up = t[e].chunk(2, dim=0)
                views[f"{prefix}.{e}.gate_proj.weight"], views[f"{prefix}.{e}.up_proj.weight"] = gate, up
            elif leaf == "down_proj":
                views[f"{prefix}.{e}.down_proj.weight"] = t[e]
    return views


def hf_targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor an HF-named weight can be written to: buffers, parameters (tied aliases too)
    and per-expert views of fused MoE experts (`expert_views`)."""
    targets = dict(model.named_buffers(remove_duplicate=False))
    targets.update(model.named_parameters(remove_duplicate=False))
    targets.update(expert_views(targets))
    return targets


def copy_all(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """`target.copy_(source)` for every pair (cast and moved as `copy_` does), as one
    `torch._foreach_copy_` per group of pairs with the same devices and dtypes on both sides: on a GPU
    one multi-tensor kernel instead of a launch per tensor. A lone pair, or a group writing one tensor
    twice (tied weights named twice, where the last write must win), is copied one by one."""
    groups: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for target, source in zip(targets, sources):
        dsts, srcs = groups.setdefault((target.device, target.dtype, source.device, source.dtype), ([], []))
        dsts.append(target)
        srcs.append(source)
    for dsts, srcs in groups.values():
        if len(dsts) > 1 and len({t.data_ptr() for t in dsts}) == len(dsts):
            torch._foreach_copy_(dsts, srcs)
        else:
            for target, source in zip(dsts, srcs):
                target.copy_(source)


@torch.no_grad()
def load_hf_named(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Write HF-named weights (checkpoint or in-memory names, experts fused or per expert) into an
    HF model; ValueError naming what it does not have or what is left unwritten."""
    targets = hf_targets(model)
    unknown = sorted(set(state) - set(targets))
    if unknown:
        raise ValueError(f"{len(unknown)} weight(s) are not the model's, e.g. {unknown[:3]}")
    copy_all([targets[name] for name in state], list(state.values()))
    written = sum(tensor.numel() for tensor in state.values())
    total = sum(p.numel() for p in model.parameters())
    if written < total:
        raise ValueError(f"the weights cover {written} of the model's {total} parameter values")


def load_format_is_flat(load_format: str | None) -> bool:
    """A broadcast bucket's `load_format`: None (tensor by tensor, SGLang's) or `flat_bytes`;
    ValueError naming any other."""
    if load_format not in (None, FLAT_BYTES):
        raise ValueError(f"load_format={load_format!r} is not a broadcast format this receiver reads "
                         f"(None: tensor by tensor, or {FLAT_BYTES!r}: one buffer per bucket)")
    return load_format == FLAT_BYTES


class WeightReceiver:
    """Receiving side of the push (the `hf` engine; the training backends' ranks subclass `load`):
    holds the weight groups and loads received tensors into the model.

    `step_lock` (the engine's) is held while tensors are copied in, so no forward sees half a
    bucket. A well-formed bucket is always received in full; names or shapes the model does not
    have reject it whole (nothing loaded). `version`: the last complete push's `weight_version`,
    as `version_type` reads it (SGLang's is a string; the training ranks count pushes).

    `cache_walk`: keep the model walk (`_targets()`) from one push to the next, until `forget_walk`
    (the hf engine, which calls it wherever its model's tensors may be replaced); off, every session
    and every bucket outside one walks the model anew (the training ranks: their owners move and
    reshard the model's tensors without telling the receiver)."""

    version_type: Callable[[Any], Any] = str

    def __init__(self, model: torch.nn.Module, *, step_lock: threading.Lock | None = None, timeout_s: float = 600.0,
                 device: torch.device | str = "cpu", cache_walk: bool = False):
        self.model, self.timeout_s, self.cache_walk = model, timeout_s, cache_walk
        self.step_lock = step_lock if step_lock is not None else contextlib.nullcontext()
        self.device = torch.device(device)
        self.version: Any = None
        # A flattened bucket kept open after loading (`load_tensor_payload(hold=True)`): within a
        # weight-update session the sender writes every bucket into one buffer, so the next
        # bucket's handle is found open (ipc.py). Dropped at the session's end (`held = None`).
        self.held: torch.Tensor | None = None
        self.groups: dict[str, WeightGroup] = {}
        self._walk: dict[str, torch.Tensor] | None = None  # _targets() of the bucket in hand (_one_walk)
        self._session_walk: dict[str, torch.Tensor] | None = None  # ... of every bucket of a session (open_session)
        self._kept_walk: dict[str, torch.Tensor] | None = None  # ... of every push until forget_walk (cache_walk)
        # Groups out of step after a request we refused before receiving: the sender may have
        # pushed bytes we never read, so receiving on them again could misparse (and gloo aborts
        # the process on a size mismatch). Kept referenced, never used, until destroyed.
        self.quarantined: dict[str, WeightGroup] = {}
        self.armed: ArmedPush | None = None  # the receive loop of an armed push (`arm`), until its end is answered
        self.draining: ArmedDrain | None = None  # the bytes of a push refused after its sender went ahead (`drain`)
        self.layouts = Layouts()  # the armed pushes' layouts by `layout_id` (armed.py), parsed once each
        self._flat_plans: OrderedDict[int, FlatBucketPlan] = OrderedDict()  # by id(specs): `_flat_plan`

    def init_group(self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
                   group_name: str, backend: str) -> str:
        """Blocking join; returns a message. Raises ValueError for a request that cannot work."""
        if group_name in self.groups or group_name in self.quarantined:
            raise ValueError(f"weight update group {group_name!r} already exists; destroy it first")
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError("backend 'nccl' needs an engine on a CUDA device; use backend 'gloo' on CPU")
        self.groups[group_name] = create_weight_group(
            master_address=master_address, master_port=master_port, rank=rank_offset, world_size=world_size,
            group_name=group_name, backend=backend, timeout_s=self.timeout_s,
            device=self.device if backend == "nccl" else None)
        return f"joined weight update group {group_name!r} as rank {rank_offset} of {world_size}"

    def destroy_group(self, group_name: str) -> str:
        group = self.groups.pop(group_name, None)
        if group is not None:
            group.destroy()
        elif self.quarantined.pop(group_name, None) is None:
            raise ValueError(f"no weight update group named {group_name!r}; known: {sorted(self.groups)}")
        return f"destroyed weight update group {group_name!r}"

    def quarantine(self, group_name: str) -> None:
        if group_name in self.groups:
            self.quarantined[group_name] = self.groups.pop(group_name)

    def group(self, group_name: str) -> WeightGroup:
        if group_name in self.quarantined:
            raise ValueError(f"weight update group {group_name!r} is out of step after a rejected request; "
                             "destroy it and call /init_weights_update_group again")
        if group_name not in self.groups:
            raise ValueError(f"no weight update group named {group_name!r}; call /init_weights_update_group "
                             f"first (known: {sorted(self.groups)})")
        return self.groups[group_name]

    def _targets(self) -> dict[str, torch.Tensor]:
        return hf_targets(self.model)

    def _walked(self) -> dict[str, torch.Tensor]:
        """`_targets()`: the kept walk where `cache_walk` holds one (made now if not), else a new walk."""
        if not self.cache_walk:
            return self._targets()
        if self._kept_walk is None:
            self._kept_walk = self._targets()
        return self._kept_walk

    def forget_walk(self) -> None:
        """The model's tensors may have been replaced (moved, reallocated): the next bucket or session
        walks the model anew. Its owner calls this (the hf engine: memory released or resumed)."""
        self._kept_walk = self._session_walk = None
        self._flat_plans.clear()  # (they hold the old tensors)

    def _bucket_targets(self) -> dict[str, torch.Tensor]:
        """`_targets()`, walked once per bucket (`_one_walk`): a module walk costs ~1 ms on a
        36-layer model, and checking, placing and loading a bucket asked for it three times."""
        return self._walk if self._walk is not None else self._walked()

    @contextlib.contextmanager
    def _one_walk(self) -> Iterator[None]:
        self._walk = self._session_walk if self._session_walk is not None else self._walked()
        try:
            yield
        finally:
            self._walk = None

    def open_session(self) -> None:
        """`/begin_weight_update`: the model's tensors are walked once for every bucket of the push
        (not once per bucket), since nothing reallocates them while a session is open; with
        `cache_walk`, once for every push until `forget_walk`."""
        self._session_walk = self._walked()

    def close_session(self, *, synchronize: bool = True) -> None:
        """`/end_weight_update`: wait for buckets still loading (`deferred`; `synchronize=False`: the
        caller knows none is, e.g. an armed loop that took every bucket), forget the walk."""
        self._session_walk = None
        if synchronize:
            self.synchronize()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def problems(self, specs: list[TensorSpec]) -> list[str]:
        """Names the model does not have and shapes that do not match it."""
        targets, found = self._bucket_targets(), []
        for spec in specs:
            target = targets.get(spec.name)
            if target is None:
                found.append(f"{spec.name!r} is not a parameter of the model")
            elif tuple(target.shape) != spec.shape:
                found.append(f"{spec.name!r} has shape {list(spec.shape)}, the model has {list(target.shape)}")
        return found

    def receive(self, specs: list[TensorSpec], group: WeightGroup) -> list[torch.Tensor]:
        """Blocking: receive every tensor of the bucket, in order, from rank 0."""
        received = []
        for spec in specs:
            tensor = torch.empty(spec.shape, dtype=spec.dtype, device=group.device)
            group.broadcast(tensor, src=0)
            received.append(tensor)
        group.synchronize()
        return received

    def load(self, specs: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
        targets = self._bucket_targets()
        with self.step_lock, torch.no_grad():
            copy_all([targets[spec.name] for spec in specs], tensors)

    # ---- a push begins and ends ---------------------------------------------------------
    def begin(self) -> None:
        """`/begin_weight_update`: a push starts (a subclass drops what an unfinished one left)."""

    def finish(self, version: Any, message: str) -> tuple[bool, str]:
        """The push's last bucket is loaded (it carries the version): take the version. A subclass
        may refuse it (megatron: a fused tensor left incomplete)."""
        self.version = self.version_type(version)
        return True, f"{message} Weight version updated to {version}."

    def take_version(self, success: bool, message: str, weight_version: Any) -> tuple[bool, str]:
        """A loaded bucket's (success, message), after `finish` when it carries the push's version."""
        if success and weight_version is not None:
            return self.finish(weight_version, message)
        return success, message

    def plan(self, payload: dict[str, Any]) -> ArmedPlan:
        """An `/arm_weight_update` body as a plan (`armed.parse_plan`): its buckets sent, or named by a
        `layout_id` this receiver holds (`layouts`). ValueError for a layout it cannot take,
        `LayoutUnknown` for an id alone that it does not hold."""
        return parse_plan(payload, self.layouts)

    def arm(self, payload: dict[str, Any] | ArmedPlan, *, start: bool = True) -> ArmedPush:
        """`/arm_weight_update` (armed.py): check the push's layout (`plan`, unless given) and group and start
        the loop that begins the push, opens the session and takes its buckets (`armed`; `start=False`:
        the caller starts it, `ArmedPush.start`). ValueError for a layout or group it cannot take, or while
        an earlier armed push still receives on a live group (one left on a group since destroyed is
        abandoned: its receive can only fail)."""
        plan = payload if isinstance(payload, ArmedPlan) else self.plan(payload)
        group = self.group(plan.group_name)
        earlier, drain = self.armed, self.draining
        if earlier is not None and not earlier.done() and self.groups.get(earlier.plan.group_name) is earlier.group:
            raise ValueError(f"an armed weight update is still receiving on group {earlier.plan.group_name!r}; "
                             "end it (/end_weight_update) or destroy the group first")
        if drain is not None and not drain.done() and self.groups.get(drain.group_name) is drain.group:
            raise ValueError(f"a refused weight update is still being drained from group {drain.group_name!r}")
        self.armed = ArmedPush(self, plan, group, start=start)  # (its loop begins the push, opens the session)
        return self.armed

    def drain(self, group_name: str, sizes: list[int], why: str) -> ArmedDrain:
        """Take the bytes of a push whose arm was refused after its sender went ahead (`armed.ArmedDrain`:
        `sizes`, each bucket's flat length) and load nothing; a receive that fails quarantines the group.
        ValueError for a group it cannot receive on (the sender then rebuilds the group)."""
        group = self.group(group_name)
        for busy in (self.armed, self.draining):
            if busy is not None and not busy.done() and busy.group is group:
                raise ValueError(f"an earlier weight update is still receiving on group {group_name!r}: the "
                                 "refused push's bytes cannot be told from its")

        def failed() -> None:
            if self.groups.get(group_name) is group:
                self.quarantine(group_name)

        self.draining = ArmedDrain(group, sizes, group_name, why, on_failure=failed)
        return self.draining

    # ---- the ways a bucket arrives -------------------------------------------------------
    def update(self, payload: dict[str, Any]) -> tuple[bool, str]:
        """`/update_weights_from_distributed` (blocking): receive one bucket from rank 0 of the
        payload's group, load it and take its version. ValueError for a malformed payload."""
        specs = parse_specs(payload["names"], payload["dtypes"], payload["shapes"])
        success, message = self.receive_and_load(specs, payload.get("group_name"),
                                                 flat=load_format_is_flat(payload.get("load_format")))
        return self.take_version(success, message, payload.get("weight_version"))

    def load_tensor_payload(self, payload: dict[str, Any], *, hold: bool = False,
                            deserializer: Callable[[Any], Any] = deserialize) -> tuple[bool, str]:
        """`/update_weights_from_tensor` (blocking), for every receiver: decode the payload in its
        `load_format` (SGLang's flattened bucket or a (name, tensor) list; tensor-parallel rank 0's
        copy), check and load its tensors like a received bucket, take `weight_version` when it
        carries one. Returns SGLang's (success, message); ValueError for a payload that does not
        decode. `hold`: keep a flattened bucket's memory open afterwards (`held`)."""
        named, flat = decode_tensor_payload(payload, deserializer)
        success, message = self.load_named(named)
        self.held = flat if success and hold else None
        del named, flat  # the sender's memory: let go of it unless held
        return self.take_version(success, message, payload.get("weight_version"))

    def load_named(self, named: list[tuple[str, torch.Tensor]]) -> tuple[bool, str]:
        """`/update_weights_from_tensor`: tensors already here (opened CUDA IPC handles); checked
        like a received bucket, then copied in. Returns SGLang's (success, message)."""
        specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in named]
        with self._one_walk():
            problems = self.problems(specs)
            if problems:
                return False, f"rejected {len(specs)} tensors, nothing loaded: " + "; ".join(problems)
            self.load(specs, [t for _, t in named])
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # done reading the sender's memory
        return True, f"loaded {len(specs)} tensors by CUDA IPC"

    def _in_place(self, specs: list[TensorSpec], group: WeightGroup) -> list[torch.Tensor | None]:
        """Per spec, the model tensor the bytes can be received straight into (same dtype, shape,
        device, contiguous), else None (received into scratch, then copied in)."""
        targets = self._bucket_targets()
        direct = []
        for spec in specs:
            t = targets[spec.name]
            ok = (t.dtype == spec.dtype and tuple(t.shape) == spec.shape and t.device == group.device
                  and t.is_contiguous())
            direct.append(t if ok else None)
        return direct

    def receive_and_load(self, specs: list[TensorSpec], group_name: str, *, flat: bool = False,
                         deferred: bool = False) -> tuple[bool, str]:
        """Blocking; returns SGLang's (success, message). A bucket sent tensor by tensor that fits
        the model is received under the step lock straight into the model's tensors where their
        layout allows (no scratch copy). A subclass whose `load` transforms (shards) receives into
        scratch and loads after. A `flat` bucket is one broadcast into one buffer, then loaded
        from views into it (one copy, ~1 ms per GB on a GPU, against ~0.15 ms saved per tensor).
        `deferred` (a flat bucket that is not a push's last, on a GPU): the receive and the copies
        are queued on the device and the call returns without waiting for them, so the next
        bucket's receive is queued while this one is on the wire; the last bucket of the push
        (and the session's end) waits for all of them."""
        with self._one_walk():
            return self._receive_and_load(specs, self.group(group_name), flat, deferred and flat)

    def receive_flat(self, specs: list[TensorSpec], group: WeightGroup, *, wait: bool = True) -> list[torch.Tensor]:
        """Receive a flat bucket (one broadcast of its bytes) and return its tensors as views;
        `wait=False` only queues the receive on a GPU (later work on the stream is ordered after it)."""
        flat = torch.empty(flat_layout([spec_bytes(s) for s in specs])[1], dtype=torch.uint8, device=group.device)
        group.broadcast(flat, src=0)
        if wait:
            group.synchronize()
        return flat_views(flat, specs)

    def _flat_plan(self, specs: list[TensorSpec]) -> FlatBucketPlan:
        """`specs`' FlatBucketPlan against the model walk in hand: the kept one where `cache_walk` holds
        the walk it was made for (`forget_walk` drops them all), else made now."""
        walk, kept = self._bucket_targets(), self._flat_plans.get(id(specs))
        if kept is not None and kept.specs is specs and kept.walk is walk:
            self._flat_plans.move_to_end(id(specs))
            return kept
        sizes, problems = [spec_bytes(s) for s in specs], self.problems(specs)
        targets = [walk[s.name] for s in specs] if type(self).load is WeightReceiver.load and not problems else None
        cut = targets is not None and unpadded(sizes) and len({s.dtype for s in specs}) == 1
        one_copy = cut and len(targets) > 1 and len({t.data_ptr() for t in targets}) == len(targets) and \
            len({(t.device, t.dtype) for t in targets}) == 1
        plan = FlatBucketPlan(specs, walk, flat_layout(sizes)[1], problems, targets, cut, one_copy)
        if self.cache_walk:  # (else every bucket walks the model anew: a plan would never be found again)
            self._flat_plans[id(specs)] = plan
            while len(self._flat_plans) > FLAT_PLANS_KEPT:
                self._flat_plans.popitem(last=False)
        return plan

    def _load_flat(self, specs: list[TensorSpec], group: WeightGroup, deferred: bool) -> tuple[bool, str] | None:
        """A flat bucket, by its `FlatBucketPlan`: received into one buffer and loaded from views into it
        (on a GPU the views and copies are queued behind the receive). (False, why) for a bucket refused
        (its bytes taken)."""
        plan = self._flat_plan(specs)
        flat = torch.empty(plan.nbytes, dtype=torch.uint8, device=group.device)
        group.broadcast(flat, src=0)
        if plan.problems:
            group.synchronize()  # the bytes are taken, nothing is loaded
            return False, f"rejected the bucket of {len(specs)} tensors, nothing loaded: " + "; ".join(plan.problems)
        if plan.targets is None:
            self.load(specs, flat_views(flat, specs))
        else:
            views = cut_flat(flat, specs[0].dtype, plan.targets) if plan.cut else flat_views(flat, specs)
            with self.step_lock, torch.no_grad():
                if plan.one_copy:
                    torch._foreach_copy_(plan.targets, list(views))
                else:
                    copy_all(plan.targets, views)
        if not deferred:
            self.synchronize()  # this bucket's copies, and every deferred bucket's before it
        return None

    def _receive_and_load(self, specs: list[TensorSpec], group: WeightGroup, flat: bool,
                          deferred: bool) -> tuple[bool, str]:
        if flat:
            refused = self._load_flat(specs, group, deferred)
            if refused is not None:
                return refused
            nbytes = sum(spec_bytes(s) for s in specs)
            return True, f"loaded {len(specs)} tensors ({nbytes} bytes)"
        problems = self.problems(specs)
        if problems:
            self.receive(specs, group)  # the sender is blocked in the broadcast: take the bytes, load nothing
            return False, f"rejected the bucket of {len(specs)} tensors, nothing loaded: " + "; ".join(problems)
        if type(self).load is not WeightReceiver.load:
            tensors = self.receive(specs, group)
            self.load(specs, tensors)
        else:
            direct, targets = self._in_place(specs, group), self._bucket_targets()
            with self.step_lock, torch.no_grad():
                tensors = [t if t is not None else torch.empty(s.shape, dtype=s.dtype, device=group.device)
                           for s, t in zip(specs, direct)]
                for tensor in tensors:
                    group.broadcast(tensor, src=0)
                group.synchronize()
                scratch = [(targets[spec.name], tensor) for spec, target, tensor in zip(specs, direct, tensors)
                           if target is None]
                copy_all([t for t, _ in scratch], [s for _, s in scratch])
        nbytes = sum(math.prod(s.shape) * t.element_size() for s, t in zip(specs, tensors))
        return True, f"loaded {len(specs)} tensors ({nbytes} bytes)"
