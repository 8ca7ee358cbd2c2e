"""The run's GPUs as one Ray placement group, and the processes put on them.

`relax.config.placement` decides, before Ray starts, which bundle (GPU) every training rank and
every engine GPU goes to and what fraction of it each reserves. Here that is carried out:

- `create_gpu_group(run_id, placement)`: one bundle per GPU ({"GPU": 1, "CPU": the ranks on
  it}), packed, named after the run so every role's replica finds it (`run_gpu_group()`);
- `on_bundle(bundle, fraction)`: the Ray options that put a training rank on a bundle;
- `GpuSlots`: engines are child processes of their role's replica, not Ray actors, so the GPUs
  they use are held by one small slot actor per engine GPU (num_gpus = the fraction, no CPU),
  which also tells which physical GPU Ray gave it; the engine is started with
  `CUDA_VISIBLE_DEVICES` set to those GPUs. Ray's accounting then matches what runs where.

Identities "<node id>:<GPU id>" name a GPU across processes: two processes with the same one
share it, and weights move between them by CUDA IPC instead of NCCL.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.util.placement_group import get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from relax.config.placement import GpuPlacement
from relax.utils.proc import RUN_ENV

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0


def group_name(run_id: str) -> str:
    return f"relax-{run_id}-gpus"


def create_gpu_group(run_id: str, placement: GpuPlacement, timeout_s: float = READY_TIMEOUT_S) -> Any:
    """Reserve the run's GPUs; raises naming what the cluster lacks if they do not come."""
    bundles = [{"GPU": 1.0, **({"CPU": cpus} if cpus else {})} for cpus in placement.bundle_cpus]
    pg = placement_group(bundles, strategy="PACK", name=group_name(run_id))
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise RuntimeError(f"the run's {placement.bundles} GPU bundle(s) {bundles} were not placed within "
                           f"{timeout_s:.0f}s; the cluster has {ray.available_resources().get('GPU', 0):g} GPUs free "
                           "(another job holds them?)") from None
    logger.info("GPUs reserved: %d bundle(s), %g of a GPU per process", placement.bundles, placement.fraction)
    return pg


def run_gpu_group() -> Any:
    """The placement group of the run this process belongs to."""
    run_id = os.environ.get(RUN_ENV)
    if not run_id:
        raise RuntimeError(f"{RUN_ENV} is not set: this process is not part of a run with GPUs")
    return get_placement_group(group_name(run_id))


def on_bundle(pg: Any, bundle: int, fraction: float) -> dict[str, Any]:
    """Ray actor options for a process that reserves `fraction` of bundle `bundle`'s GPU."""
    return {"num_gpus": fraction, "scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=bundle, placement_group_capture_child_tasks=False)}


def gpu_identity() -> str | None:
    """"<node id>:<GPU id>" of this Ray worker's first GPU (None without one)."""
    gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    return f"{ray.get_runtime_context().get_node_id()}:{gpus[0]}" if gpus else None


@ray.remote(num_cpus=0)
class _Slot:
    """Holds a share of one GPU for an engine (a child process of a replica) and says which."""

    def where(self) -> tuple[str, list[Any]]:
        return ray.get_runtime_context().get_node_id(), list(ray.get_gpu_ids())


class GpuSlots:
    """Per engine, the GPUs its slots hold: the device string its launcher takes
    ("cuda:<ids>") and the GPUs' identities (for the weight sender)."""

    def __init__(self, slots: tuple[tuple[int, ...], ...], fraction: float) -> None:
        pg = run_gpu_group()
        self.actors = [[_Slot.options(**on_bundle(pg, b, fraction)).remote() for b in engine] for engine in slots]
        where = [ray.get([a.where.remote() for a in engine], timeout=READY_TIMEOUT_S) for engine in self.actors]
        here = ray.get_runtime_context().get_node_id()
        self.devices: list[str] = []
        self.identities: list[tuple[str, ...]] = []
        for i, engine in enumerate(where):
            nodes = {node for node, _ in engine}
            if nodes != {here}:
                self.release()
                raise RuntimeError(f"engine {i}'s GPUs are on node(s) {sorted(nodes)}, not on this replica's node "
                                   f"{here}: engines are started by their role's replica, so they must share its "
                                   "node (multi-node engine placement is not supported yet)")
            ids = [str(g) for _, gpus in engine for g in gpus]
            self.devices.append("cuda:" + ",".join(ids))
            self.identities.append(tuple(f"{node}:{g}" for node, gpus in engine for g in gpus))

    def release(self) -> None:
        for engine in self.actors:
            for actor in engine:
                ray.kill(actor, no_restart=True)
        self.actors = []


def engine_gpus(role: Any) -> GpuSlots | None:
    """The GPU slots of an engine role's plan (`RolePlan.slots`), or None on CPU."""
    return GpuSlots(role.slots, role.gpu_fraction) if role.slots else None
