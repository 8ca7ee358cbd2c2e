"""GPUs for the engines a scale-out adds on a GPU cluster (`ray_native` mode, relax.engine.elastic).

The run's placement group holds exactly the GPUs its plan needs, so an engine added mid-run needs
GPUs from outside it. As for the startup engines (`placement.GpuSlots`), the engine is a child
process of the Rollout replica and its GPUs are held by slot actors: here one whole GPU per slot
(`num_gpus=1`), pinned to the replica's node (the engine is started there), in no placement group.
Ray's accounting then shows the scale-out: other jobs cannot take those GPUs, and they are free
again when the engine leaves (`release`).

`room()` is how many more engines the node's free GPUs hold; `acquire` raises naming the node and
what is free when a slot is not granted in time (another job took the GPU meanwhile).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from relax.distributed.ray.placement import _Slot

logger = logging.getLogger(__name__)


def free_gpus_on(node_id: str) -> float:
    """GPUs Ray has not handed out on node `node_id` (the cluster's, on a cluster Ray cannot split)."""
    try:
        from ray._private.state import available_resources_per_node

        return float(available_resources_per_node().get(node_id, {}).get("GPU", 0.0))
    except (ImportError, AttributeError):  # a Ray without the per-node view: the cluster's count
        return float(ray.available_resources().get("GPU", 0.0))


class ElasticGpus:
    """Whole GPUs for added engines, `gpus_per_engine` each, on this process's node (module doc)."""

    def __init__(self, gpus_per_engine: int) -> None:
        if gpus_per_engine < 1:
            raise ValueError(f"gpus_per_engine must be >= 1, got {gpus_per_engine}")
        self.gpus_per_engine = gpus_per_engine
        self.node = ray.get_runtime_context().get_node_id()
        self.held: dict[str, tuple[list[Any], tuple[str, ...]]] = {}  # device -> (slot actors, identities)

    def room(self) -> int:
        """How many more engines the node's free GPUs hold."""
        return int(free_gpus_on(self.node) // self.gpus_per_engine)

    def acquire(self, timeout_s: float) -> str:
        """Hold `gpus_per_engine` free GPUs of this node; the engine's device string ("cuda:<ids>")."""
        pin = NodeAffinitySchedulingStrategy(node_id=self.node, soft=False)
        actors = [_Slot.options(num_gpus=1, scheduling_strategy=pin).remote() for _ in range(self.gpus_per_engine)]
        try:
            where = ray.get([a.where.remote() for a in actors], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            for actor in actors:
                ray.kill(actor, no_restart=True)
            raise RuntimeError(f"{self.gpus_per_engine} free GPU(s) for a new engine were not granted on node "
                               f"{self.node} within {timeout_s:g}s ({free_gpus_on(self.node):g} free there now; "
                               "engines start on the Rollout replica's node)") from None
        ids = [str(g) for _, gpus in where for g in gpus]
        device = "cuda:" + ",".join(ids)
        self.held[device] = (actors, tuple(f"{node}:{g}" for node, gpus in where for g in gpus))
        logger.info("GPU(s) %s held for a new engine", device)
        return device

    def identities(self) -> dict[str, tuple[str, ...]]:
        """Per held device, its GPUs' identities ("<node id>:<GPU id>", as `GpuSlots.identities`)."""
        return {device: identity for device, (_, identity) in self.held.items()}

    def release(self, device: str | None) -> None:
        """Give the GPUs of `device` back (no-op for a device not held here, e.g. a startup engine's)."""
        actors, _ = self.held.pop(device, ([], ())) if device is not None else ([], ())
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if actors:
            logger.info("GPU(s) %s given back", device)

    def release_all(self) -> None:
        for device in list(self.held):
            self.release(device)
