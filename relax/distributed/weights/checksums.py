"""The checksums of --check-weight-update-equal, as both sides compute them: the trainer's check
(`check.WeightCheck`) and the hf engine's `/weights_checker` answer. Apart from check.py so the
engine does not import the sender's HTTP client."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

from relax.distributed.weights.protocol import dtype_name


def tensor_checksum(tensor: torch.Tensor) -> str:
    """16 hex digits of the SHA-256 of a tensor's bytes, in memory order (SGLang's hash of a CPU tensor)."""
    flat = tensor.detach().contiguous().cpu().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def named_checksums(targets: dict[str, torch.Tensor], names: Sequence[str] | None) -> dict[str, Any]:
    """The hf engine's `checksum` answer: checksum and dtype of each of `names` (default: all of
    `targets`), and the names it does not have."""
    wanted = list(targets) if names is None else list(names)
    held = [n for n in wanted if n in targets]
    return {"checksums": {n: tensor_checksum(targets[n]) for n in held},
            "dtypes": {n: dtype_name(targets[n].dtype) for n in held},
            "missing": [n for n in wanted if n not in targets]}
