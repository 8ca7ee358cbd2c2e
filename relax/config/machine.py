"""What this machine has, read without importing torch or the packages themselves.

`--rollout-backend auto` / `--train-backend auto` and `relax-train --dry-run` decide from it in
well under a second: the GPUs the NVIDIA driver lists (limited by CUDA_VISIBLE_DEVICES) and
whether a package is installed (found on the path, not imported: importing sglang or
megatron-core costs seconds).
"""

from __future__ import annotations

import importlib.util
import os

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
