"""--train-memory-margin-bytes: on a GPU the trainer shares with the engines (colocate), training
leaves this much of the GPU free.

slime hands the margin to torch_memory_saver, whose allocator refuses a training allocation that
would leave less than the margin free on the device (what the engines keep while they sleep, NCCL's
buffers and other processes' CUDA contexts live there). Here the rank's CUDA caching allocator is
capped the same way when its state is back on the GPU and at the start of each training pass
(`torch.cuda.set_per_process_memory_fraction`): at most what it holds now plus what is free, less
the margin. An allocation past the cap is torch's OutOfMemoryError (the allocator first frees its
cached blocks and retries) rather than memory taken from the engines. When less than the margin is
free already, `MemoryMarginError` says so at once, naming the flag and the fix. The cap is
recomputed each time, since what the engines hold changes between phases.

Only the training backends' ranks on a shared GPU get a margin (`TrainerSpec.memory_margin_bytes`,
0 elsewhere); on CPU there is no device memory to reserve and nothing happens.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

GIB = float(1 << 30)


class MemoryMarginError(RuntimeError):
    """Less GPU memory is free than --train-memory-margin-bytes asks training to leave."""


def reserve_margin(device: torch.device, margin_bytes: int, who: str) -> dict[str, float]:
    """Cap this process's CUDA allocator on `device` so `margin_bytes` of the GPU stay free; the cap
    and the margin as metrics ({} when there is no margin or no CUDA device)."""
    if margin_bytes <= 0 or device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_reserved(device)  # this process's allocator: what the cap counts
    if free < margin_bytes:
        others = max(total - free - held, 0)
        raise MemoryMarginError(
            f"{who} on {device}: {free / GIB:.2f} GiB of the GPU is free, less than --train-memory-margin-bytes "
            f"{margin_bytes / GIB:.2f} GiB that training must leave free (the trainer holds {held / GIB:.2f} GiB, "
            f"other processes on the GPU, the engines among them, {others / GIB:.2f} GiB): let the engines release "
            "their memory while the trainer runs (--offload-rollout), give them less (--sglang-mem-fraction-static), "
            "or lower the margin")
    allowed = held + free - margin_bytes
    fraction = min(max(allowed / total, 0.0), 1.0)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    logger.debug("%s: CUDA allocator capped at %.2f GiB of %.2f GiB (%.2f GiB left free: "
                 "--train-memory-margin-bytes)", who, allowed / GIB, total / GIB, margin_bytes / GIB)
    return {"memory/train_allowed_gib": allowed / GIB, "memory/train_margin_gib": margin_bytes / GIB}
