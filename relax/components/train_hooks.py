"""The Actor's plugin hook on a step's training rows: `--rollout-data-postprocess-path`.

Called as slime calls it, `fn(args, rollout_id, rollout_data)`, once per step after the Actor
has every column (old log-probs, advantages) and before the first optimizer step; typically it
rewrites loss masks. `rollout_data` maps column names (`tokens`, `response_lengths`,
`loss_masks`, `rewards`, `rollout_log_probs`, `old_log_probs`, `advantages`, `ref_log_probs`,
...) to per-row lists: the hook may edit them in place or assign new lists of the same length;
both reach training. Colocate mode only (validation): fully async trains rows as they arrive.
"""

from __future__ import annotations

from typing import Any, Callable

from relax.types import TrainBatch
from relax.utils.plugins import load_plugin

FLAG = "--rollout-data-postprocess-path"
SIGNATURE = "fn(args, rollout_id, rollout_data)"


def load_postprocess(path: str | None) -> Callable[..., Any] | None:
    return load_plugin(path, flag=FLAG, positional=3, expected=SIGNATURE) if path else None


def postprocess_rows(fn: Callable[..., Any], args: Any, rollout_id: int, batch: TrainBatch) -> list[str]:
    """Run the hook on `batch`'s columns and write what it returns or assigns back into the batch;
    returns the columns it replaced. A column it resized is an error naming the hook."""
    fields = {name.rsplit("_", 1)[0]: name for name in batch.present()}
    data = {column: getattr(batch, name) for column, name in fields.items()}
    fn(args, rollout_id, data)
    replaced = []
    for column, value in data.items():
        name = fields.get(column)
        if name is None or value is getattr(batch, name):
            continue
        if value is not None and len(value) != len(batch):
            raise ValueError(f"{FLAG}: the hook set rollout_data[{column!r}] to {len(value)} rows; the step has "
                             f"{len(batch)} (keep one entry per row)")
        setattr(batch, name, value)
        replaced.append(column)
    return replaced
