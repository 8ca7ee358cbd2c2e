"""What this machine has, read without importing torch or the packages themselves.

`--rollout-backend auto` / `--train-backend auto` and `relax-train --dry-run` decide from it in
well under a second: the GPUs the NVIDIA driver lists (limited by CUDA_VISIBLE_DEVICES) and
whether a package is installed (found on the path, not imported: importing sglang or
megatron-core costs seconds). `target` is the machine a plan is made for: this one, or the
cluster `--cluster` describes.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # the driver's list of GPUs, one directory each


def local_gpus() -> int:
    """GPUs on this machine without importing torch (for --dry-run): the NVIDIA driver's list,
    limited by CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        count = len(os.listdir(NVIDIA_GPUS))
    except OSError:
        return 0
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return count


def sglang_installed() -> bool:
    """The sglang package is on this Python's path (found, not imported: importing it costs seconds)."""
    return importlib.util.find_spec("sglang") is not None


def megatron_installed() -> bool:
    """megatron-core is on this Python's path (found, not imported)."""
    return importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None


@dataclass(frozen=True)
class Target:
    """What the plan is made for: this machine, or (`--cluster`, with --dry-run) a cluster this machine
    is not part of, where GPU nodes are taken to run the GPU image (docker/Dockerfile: sglang and
    megatron-core installed) and the engine options are checked by SGLang's parser only if it imports here."""

    gpus: int
    sglang: bool
    megatron: bool
    described: bool = False


def target(cluster: dict | None = None) -> Target:
    """This machine, or the cluster `--cluster` describes (its GPUs per node)."""
    if cluster is None:
        return Target(local_gpus(), sglang_installed(), megatron_installed())
    gpus = cluster.get("gpus_per_node", 0)
    return Target(gpus if isinstance(gpus, int) else 0, True, True, described=True)
