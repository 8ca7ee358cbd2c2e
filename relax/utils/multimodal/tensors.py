"""A row's encoder tensors on the data plane and in a batch.

The rollout hands each sample's encoder tensors (`pixel_values`, `image_grid_thw`,
`input_features`, ...) to the trainers through TransferQueue as safetensors bytes (`to_bytes` /
`from_bytes`: a plain tensor format, so no pickle on the data plane: untrusted bytes are never
unpickled). A trainer's micro-batch, and the engine's prefill group, then `collate` the rows'
tensors into one set of model kwargs.
"""

from __future__ import annotations

from typing import Any, Sequence


def to_bytes(tensors: dict[str, Any] | None) -> bytes:
    """A row's model tensors as safetensors bytes (b"" for a text-only row)."""
    if not tensors:
        return b""
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()})


def from_bytes(data: Any) -> dict[str, Any]:
    """Inverse of `to_bytes`; accepts bytes or a uint8 tensor (TransferQueue's column value)."""
    if data is None:
        return {}
    if hasattr(data, "numpy"):
        data = data.numpy().tobytes()
    if not data:
        return {}
    from safetensors.torch import load

    return load(bytes(data))


def collate(rows: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """Model kwargs for a batch of rows: each tensor concatenated along dim 0 in row order (the
    encoders take every image of the batch as one sequence of patches, `image_grid_thw` says
    where each starts; every audio as one row of `input_features`). Tensors whose other dims
    differ (audios with different frame counts: `input_features [N, mel, F]`,
    `feature_attention_mask [N, F]`) are zero-padded to the largest first, so padded frames are
    masked out. Rows without media add nothing."""
    keys = sorted({k for r in rows if r for k in r})
    return {k: _cat_padded([r[k] for r in rows if r and k in r]) for k in keys}


def _cat_padded(tensors: list[Any]) -> Any:
    import torch

    dims = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    padded = []
    for t in tensors:
        pad = [p for d in reversed(range(1, t.dim())) for p in (0, dims[d - 1] - t.shape[d])]
        padded.append(torch.nn.functional.pad(t, pad) if any(pad) else t)
    return torch.cat(padded)
