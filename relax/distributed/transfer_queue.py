"""The data plane: TransferQueue partitions, one per rollout step (`train_{step}`).

Rollout writes one row per sample (key = the sample's global index); downstream roles add
columns to the same rows (`ref_log_probs`, `advantages`, ...); the Actor reads what it needs
and clears the partition after training, which is also the back-pressure. Variable-length
columns travel as jagged nested tensors and come back as lists of 1-D tensors.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from relax.types import Sample

logger = logging.getLogger(__name__)

# Columns written by Rollout; name -> (dtype, is_sequence).
ROLLOUT_COLUMNS: dict[str, tuple[torch.dtype, bool]] = {
    "tokens": (torch.int64, True),
    "loss_masks": (torch.int64, True),
    "rollout_log_probs": (torch.float32, True),
    "response_lengths": (torch.int64, False),
    "rewards": (torch.float32, False),
    "group_indices": (torch.int64, False),
    "sample_indices": (torch.int64, False),
    "weight_versions": (torch.int64, False),
    "truncated": (torch.int64, False),
}


def partition_id(step: int) -> str:
    return f"train_{step}"


def init_data_system(num_storage_units: int = 1) -> None:
    """Start TransferQueue's controller and storage (first caller) or attach to it."""
    import transfer_queue as tq
    from omegaconf import OmegaConf

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": num_storage_units}}}))


def attach() -> None:
    import transfer_queue as tq

    tq.init()


def close_data_system() -> None:
    import transfer_queue as tq

    tq.close()


def _column(values: Sequence[Any], dtype: torch.dtype, is_sequence: bool) -> torch.Tensor:
    if is_sequence:
        return torch.nested.nested_tensor([torch.as_tensor(v, dtype=dtype) for v in values], layout=torch.jagged)
    return torch.as_tensor(list(values), dtype=dtype)


def samples_to_columns(samples: Sequence[Sample], reward_values: Sequence[float]) -> dict[str, torch.Tensor]:
    """Rollout rows: one entry per sample, response-aligned sequences for masks/log-probs."""
    columns = {
        "tokens": [s.tokens for s in samples],
        "loss_masks": [s.loss_mask if s.loss_mask is not None else [1] * s.response_length for s in samples],
        "rollout_log_probs": [s.rollout_log_probs or [0.0] * s.response_length for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": list(reward_values),
        "group_indices": [s.group_index if s.group_index is not None else -1 for s in samples],
        "sample_indices": [s.index for s in samples],
        "weight_versions": [min(s.weight_versions) if s.weight_versions else -1 for s in samples],
        "truncated": [int(s.status == Sample.Status.TRUNCATED) for s in samples],
    }
    for s in samples:
        if len(s.tokens) < s.response_length or (s.loss_mask is not None and len(s.loss_mask) != s.response_length):
            raise ValueError(f"sample {s.index}: tokens ({len(s.tokens)}), response_length ({s.response_length}) and "
                             f"loss_mask ({len(s.loss_mask or [])}) disagree; a custom generate function must keep "
                             "len(loss_mask) == response_length <= len(tokens)")
    return {name: _column(columns[name], *ROLLOUT_COLUMNS[name]) for name in ROLLOUT_COLUMNS}


def train_data_to_columns(data: Any, samples: Sequence[Sample], reward_values: Sequence[float]
                          ) -> dict[str, torch.Tensor]:
    """Rows from a `--custom-convert-samples-to-train-data-path` result: its per-sample lists
    (slime's train-data keys: tokens, response_lengths, rewards, loss_masks, rollout_log_probs,
    truncated, sample_indices, ...) replace the default conversion's columns; keys it leaves
    out keep the default. Keys no role here reads (raw_reward, metadata, ...) are dropped."""
    flag = "--custom-convert-samples-to-train-data-path"
    if not isinstance(data, dict):
        raise TypeError(f"{flag}: the function must return a dict of per-sample lists, got {type(data).__name__}")
    unused = sorted(set(data) - set(ROLLOUT_COLUMNS))
    if unused:
        logger.debug("%s: keys without a consumer here, dropped: %s", flag, unused)
    columns = {name: list(values) for name, values in data.items() if name in ROLLOUT_COLUMNS}
    for name, values in columns.items():
        if len(values) != len(samples):
            raise ValueError(f"{flag}: '{name}' has {len(values)} entries for {len(samples)} samples; return one "
                             "entry per sample, in the samples' order")
    out = samples_to_columns(samples, reward_values)
    out.update({name: _column(values, *ROLLOUT_COLUMNS[name]) for name, values in columns.items()})
    lengths = out["response_lengths"].tolist()
    for i, n in enumerate(lengths):
        if len(out["tokens"][i]) < n or len(out["loss_masks"][i]) != n or len(out["rollout_log_probs"][i]) != n:
            raise ValueError(f"{flag}: row {i} has {len(out['tokens'][i])} tokens, response_length {n}, "
                             f"{len(out['loss_masks'][i])} loss_masks and {len(out['rollout_log_probs'][i])} "
                             "rollout_log_probs; keep len(loss_masks) == len(rollout_log_probs) == response_length "
                             "<= len(tokens)")
    return out


async def put_columns(step: int, keys: Sequence[str], columns: dict[str, torch.Tensor]) -> None:
    import transfer_queue as tq
    from tensordict import TensorDict

    await tq.async_kv_batch_put(keys=list(keys), partition_id=partition_id(step),
                                fields=TensorDict(columns, batch_size=len(keys)))


async def put_samples(step: int, samples: Sequence[Sample], reward_values: Sequence[float],
                      train_data: dict[str, Any] | None = None) -> list[str]:
    """One row per sample (key = Sample.index); `train_data` is a custom conversion's result."""
    keys = [str(s.index) for s in samples]
    if len(set(keys)) != len(keys):
        raise ValueError(f"step {step}: duplicate sample indices; every sample needs a unique Sample.index")
    if train_data is None:
        columns = samples_to_columns(samples, reward_values)
    else:
        columns = train_data_to_columns(train_data, samples, reward_values)
    await put_columns(step, keys, columns)
    return keys


async def list_keys(step: int) -> list[str]:
    import transfer_queue as tq

    listing = await tq.async_kv_list(partition_id=partition_id(step))
    return sorted(listing.get(partition_id(step), {}), key=int)


def _unpack(value: torch.Tensor) -> Any:
    if getattr(value, "is_nested", False):
        return list(value.unbind())
    return value


async def get_columns(step: int, keys: Sequence[str], fields: Sequence[str]) -> dict[str, Any]:
    """Columns for `keys` in key order: sequences as lists of 1-D tensors, scalars as a tensor."""
    import transfer_queue as tq

    data = await tq.async_kv_batch_get(keys=list(keys), partition_id=partition_id(step), select_fields=list(fields))
    return {name: _unpack(data[name]) for name in fields}


async def clear(step: int) -> None:
    import transfer_queue as tq

    keys = await list_keys(step)
    if keys:
        await tq.async_kv_clear(keys=keys, partition_id=partition_id(step))
